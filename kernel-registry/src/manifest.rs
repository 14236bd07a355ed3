//! The kernel manifest (`kernel.toml`): what an author declares, parsed and checked field by field.
//!
//! The format is documented in `docs/manifest.md`; every rule below names the field it checks.

use crate::capability::{Capability, DeclaredCapability, MAX_CAPABILITY_REASON};
use crate::domain::{Arch, DType, Digest, Op, Semantics};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// Largest source file accepted (CUDA or Python source, bytes).
pub const MAX_SOURCE_BYTES: usize = 1 << 20;
/// Largest manifest accepted (bytes).
pub const MAX_MANIFEST_BYTES: usize = 64 << 10;

/// Longest value of each stored manifest field, in bytes of UTF-8 (docs/manifest.md, "Limits").
/// Checked by `Manifest::parse` before anything is stored, the same on every backend.
pub const MAX_NAME: usize = 64;
pub const MAX_VERSION: usize = 64;
pub const MAX_DESCRIPTION: usize = 4096;
pub const MAX_AUTHORS: usize = 32;
pub const MAX_AUTHOR: usize = 200;
pub const MAX_LICENSE: usize = 200;
pub const MAX_SOURCE_NAME: usize = 128;
pub const MAX_ENTRY: usize = 128;
pub const MAX_NVRTC_OPTIONS: usize = 32;
pub const MAX_NVRTC_OPTION: usize = 256;
pub const MAX_REQUIREMENT: usize = 200;
/// Any other text field (op, semantics, runtime, an entry's dtype or stage, an arch): each is
/// one of a few known words, so a longer value is refused before it is parsed or quoted back.
pub const MAX_WORD: usize = 64;
/// Most entries a backward op's `[entry.<dtype>]` table may name (an op has at most this many
/// stages; the rest are refused by name).
pub const MAX_STAGES: usize = 8;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    /// Not TOML, a field of the wrong type, an unknown or a missing field.
    #[error("kernel.toml: {0}")]
    Syntax(String),
    /// A field parsed but its value is not allowed.
    #[error("kernel.toml: field `{field}`: {message}")]
    Field { field: String, message: String },
    /// The kernel's folder or files could not be read.
    #[error("{0}")]
    Io(String),
}

impl ManifestError {
    fn field(field: impl Into<String>, message: impl Into<String>) -> Self {
        ManifestError::Field {
            field: field.into(),
            message: message.into(),
        }
    }
    /// The field a `Field` error names (for field-level API messages).
    pub fn field_name(&self) -> Option<&str> {
        match self {
            ManifestError::Field { field, .. } => Some(field),
            _ => None,
        }
    }
}

/// How the grid is sized from the problem (docs/spec.md section 2: the launch rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Grid {
    /// `ceil(rows / rows_per_block)` blocks.
    PerRow { rows_per_block: u32 },
    /// `ceil(n / (threads_per_block * elements_per_thread))` blocks, n = output elements.
    PerElement { elements_per_thread: u32 },
    /// `blocks_per_sm * SM count` blocks; the kernel loops over its work.
    Persistent { blocks_per_sm: u32 },
}

/// One launch configuration; `cols_max` picks it for problems with at most that many columns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchRule {
    pub cols_max: Option<u64>,
    pub block: [u32; 3],
    pub grid: Grid,
    pub smem_bytes: u32,
    pub smem_bytes_per_col: u32,
}

/// Concrete launch dimensions for one problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchDims {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Constraints {
    pub cols_min: u64,
    pub cols_max: Option<u64>,
    pub cols_multiple_of: u64,
    /// Empty: any architecture.
    pub archs: Vec<Arch>,
}

impl Constraints {
    /// Why a problem with `cols` columns (elements, for elementwise ops) on `arch` is outside
    /// these constraints; `None` when it is inside. The one rule used by the verifier (cases
    /// "not applicable"), the resolver and the dashboard.
    pub fn not_applicable(&self, cols: u64, arch: Option<Arch>) -> Option<String> {
        if cols < self.cols_min {
            return Some(format!("cols {cols} < cols_min {}", self.cols_min));
        }
        if let Some(max) = self.cols_max {
            if cols > max {
                return Some(format!("cols {cols} > cols_max {max}"));
            }
        }
        if !cols.is_multiple_of(self.cols_multiple_of) {
            return Some(format!(
                "cols {cols} is not a multiple of {}",
                self.cols_multiple_of
            ));
        }
        if let Some(a) = arch {
            if !self.archs.is_empty() && !self.archs.contains(&a) {
                return Some(format!("arch {a} is not among the declared archs"));
            }
        }
        None
    }
}

/// What executes a kernel's source (docs/spec.md section 2b): NVRTC-compiled CUDA (the default), or a Python
/// function called with PyTorch tensors in a child process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Runtime {
    #[default]
    Cuda,
    Python,
}

impl Runtime {
    pub fn as_str(self) -> &'static str {
        match self {
            Runtime::Cuda => "cuda",
            Runtime::Python => "python",
        }
    }
    pub fn is_cuda(&self) -> bool {
        *self == Runtime::Cuda
    }
}

impl std::fmt::Display for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Largest number of `requires` entries of a Python candidate.
pub const MAX_REQUIRES: usize = 16;

/// A checked manifest. Its serde form is the canonical encoding hashed into the digest.
/// `runtime` and `requires` are left out of it for CUDA kernels (their digests predate them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub name: String,
    pub version: semver::Version,
    pub op: Op,
    pub semantics: Semantics,
    pub description: String,
    pub authors: Vec<String>,
    pub license: String,
    pub source: String,
    pub entries: BTreeMap<DType, String>,
    pub launch: Vec<LaunchRule>,
    pub constraints: Constraints,
    pub nvrtc_options: Vec<String>,
    #[serde(default, skip_serializing_if = "Runtime::is_cuda")]
    pub runtime: Runtime,
    /// Python packages a Python candidate imports, each `name` plus version specifiers
    /// (`liger-kernel==0.8.5`); empty for CUDA kernels.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requires: Vec<String>,
    /// Capabilities the compiled code needs (`[[capability]]`, docs/manifest.md), each with
    /// why, sorted by name; the capability audit (docs/spec.md section 3b) holds the code to
    /// them. Left out of the canonical encoding when empty (digests of kernels that declare
    /// none predate them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<DeclaredCapability>,
    /// A backward op's entries (docs/spec.md section 2c): per dtype, each of the op's
    /// [`Op::stages`] by name and its symbol (`[entry.<dtype>]` tables). `entries` then names
    /// each dtype's first stage, so that everything keyed by dtype (the store's dtype list, the
    /// compile jobs, a report's dtypes) reads it unchanged. Empty for a forward op, and left out
    /// of the canonical encoding then (forward digests predate it).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub stages: BTreeMap<DType, BTreeMap<String, String>>,
    /// A Python candidate of a backward op (`[setup]`, docs/spec.md section 2b): per dtype, a
    /// function of the op's inputs other than the incoming gradients that returns what its
    /// backward reads from a forward (Liger's RSTD, the autograd graph); the entry is then called
    /// with that state as its last argument, and the verifier runs the setup untimed before each
    /// call. Empty otherwise, and left out of the canonical encoding then (digests predate it).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub setup: BTreeMap<DType, String>,
}

// ---- what the author writes -------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifest {
    name: String,
    version: String,
    op: String,
    semantics: Option<String>,
    description: String,
    authors: Vec<String>,
    license: String,
    source: String,
    /// dtype -> symbol, or (a backward op) dtype -> { stage -> symbol }: read by [`raw_entries`].
    entry: BTreeMap<String, toml::Value>,
    launch: Option<toml::Value>,
    #[serde(default)]
    constraints: RawConstraints,
    nvrtc_options: Option<Vec<String>>,
    runtime: Option<String>,
    requires: Option<Vec<String>>,
    capability: Option<Vec<RawCapability>>,
    setup: Option<BTreeMap<String, String>>,
}

/// One dtype's `[entry]` value: a forward op's symbol, or a backward op's table of stages.
enum RawEntry {
    Symbol(String),
    Stages(BTreeMap<String, String>),
}

/// A Python backward candidate's `[setup]` table (see [`Manifest::setup`]): only for a backward
/// op, one function per dtype of `[entry]` and none other, each a Python function name.
fn check_setup(
    raw: Option<BTreeMap<String, String>>,
    entries: &BTreeMap<DType, String>,
    op: Op,
) -> Result<BTreeMap<DType, String>, ManifestError> {
    let Some(raw) = raw else {
        return Ok(BTreeMap::new());
    };
    if !op.is_backward() {
        return Err(fe(
            "setup",
            format!("{op} is a forward op: its function is the whole computation; a setup function is for a backward op's candidate (what the backward reads from a forward); remove it"),
        ));
    }
    let mut setup = BTreeMap::new();
    for (k, v) in raw {
        let dt: DType = k
            .parse()
            .map_err(|e| fe(format!("setup.{k}"), format!("{e}")))?;
        if !entries.contains_key(&dt) {
            return Err(fe(
                format!("setup.{k}"),
                format!(
                    "`[entry]` names no function for {dt}; a setup function goes with an entry"
                ),
            ));
        }
        if !is_identifier(&v) || v.starts_with("__") {
            return Err(fe(
                format!("setup.{k}"),
                format!("`{v}` is not a Python function name (ASCII letters, digits and _, not starting with a digit or __)"),
            ));
        }
        setup.insert(dt, v);
    }
    if let Some(dt) = entries.keys().find(|d| !setup.contains_key(d)) {
        return Err(fe(
            "setup",
            format!("names no setup function for {dt}: give one for every dtype of `[entry]` (each call of an entry gets its setup's state)"),
        ));
    }
    Ok(setup)
}

/// The `[entry]` values by their TOML type (a string, or a table of strings); anything else is
/// refused naming the key, without quoting the value.
fn raw_entries(
    entry: BTreeMap<String, toml::Value>,
) -> Result<Vec<(String, RawEntry)>, ManifestError> {
    let shape = |k: &str| {
        ManifestError::Syntax(format!(
            "`entry.{}`: give a symbol (`bf16 = \"my_kernel_bf16\"`), or for a backward op a table of its entries (`[entry.bf16]` with `dx = \"...\"`)",
            k.chars().take(MAX_WORD).collect::<String>()
        ))
    };
    entry
        .into_iter()
        .map(|(k, v)| {
            let e = match v {
                toml::Value::String(s) => RawEntry::Symbol(s),
                toml::Value::Table(t) => RawEntry::Stages(
                    t.into_iter()
                        .map(|(stage, sym)| match sym {
                            toml::Value::String(sym) => Ok((stage, sym)),
                            _ => Err(shape(&k)),
                        })
                        .collect::<Result<_, _>>()?,
                ),
                _ => return Err(shape(&k)),
            };
            Ok((k, e))
        })
        .collect()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCapability {
    name: String,
    reason: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLaunch {
    cols_max: Option<u64>,
    block: toml::Value,
    grid: String,
    rows_per_block: Option<u32>,
    elements_per_thread: Option<u32>,
    blocks_per_sm: Option<u32>,
    #[serde(default)]
    smem_bytes: u32,
    #[serde(default)]
    smem_bytes_per_col: u32,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawConstraints {
    cols_min: Option<u64>,
    cols_max: Option<u64>,
    cols_multiple_of: Option<u64>,
    #[serde(default)]
    archs: Vec<String>,
}

/// NVRTC options an author may set. The verifier owns the target architecture and include
/// paths, so `-arch`, `-I`, `--include-path` and anything unknown are refused.
const ALLOWED_OPTION_PREFIXES: &[&str] = &[
    "--use_fast_math",
    "-use_fast_math",
    "--fmad=",
    "-fmad=",
    "--ftz=",
    "-ftz=",
    "--prec-div=",
    "-prec-div=",
    "--prec-sqrt=",
    "-prec-sqrt=",
    "--maxrregcount=",
    "-maxrregcount=",
    "--std=c++",
    "-std=c++",
    "--define-macro=",
    "-D",
    "-lineinfo",
    "--generate-line-info",
    "--extra-device-vectorization",
    "-default-device",
];

/// The one ptxas option an author may pass, whole: ptxas on `N` threads (0: as many as it likes)
/// over the module's functions (`-Xptxas=--split-compile=N` or `--ptxas-options=--split-compile=N`).
/// It changes how long ptxas takes, not the code: the same SASS instruction for instruction
/// (docs/verifier.md, session 30); the CUBIN's bytes differ, so it is a manifest option
/// like any other, recorded with the module and used by the clients.
pub fn is_ptxas_threads_option(o: &str) -> bool {
    [
        "-Xptxas=--split-compile=",
        "--ptxas-options=--split-compile=",
    ]
    .iter()
    .filter_map(|p| o.strip_prefix(p))
    .any(|n| (1..=3).contains(&n.len()) && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The macro defined when one dtype's entry is compiled as its own module, as the verifier and
/// the clients do: `-DKERNELIZE_DTYPE_BF16`, `_F16` or `_F32`. A kernel may leave the other
/// dtypes' entries out under it (docs/manifest.md); one that ignores it compiles them all.
pub fn dtype_macro(dt: DType) -> String {
    format!("-DKERNELIZE_DTYPE_{}", dt.as_str().to_uppercase())
}

/// NVRTC options of the module holding `dt`'s entry: the author's, then the dtype macro.
pub fn entry_options(author_options: &[String], dt: DType) -> Vec<String> {
    let mut o = author_options.to_vec();
    o.push(dtype_macro(dt));
    o
}

fn fe(field: impl Into<String>, message: impl Into<String>) -> ManifestError {
    ManifestError::field(field, message)
}

/// The first character a text field may not hold, with its byte offset: NUL (PostgreSQL cannot
/// store it) and every other control character, except newlines and tabs in `multi_line` text.
pub fn forbidden_char(s: &str, multi_line: bool) -> Option<(usize, char)> {
    s.char_indices()
        .find(|&(_, c)| c.is_control() && !(multi_line && matches!(c, '\n' | '\r' | '\t')))
}

/// Refuse a field holding a character `forbidden_char` names, saying which and where.
fn plain_text(field: &str, s: &str, multi_line: bool) -> Result<(), ManifestError> {
    match forbidden_char(s, multi_line) {
        None => Ok(()),
        Some((at, c)) => Err(fe(
            field,
            format!(
                "holds the control character U+{:04X} at byte {at}; remove it{}",
                c as u32,
                if multi_line {
                    " (text may hold newlines and tabs, no other control characters)"
                } else {
                    " (this field is one line of printable text)"
                }
            ),
        )),
    }
}

/// Refuse a field longer than `max` bytes, naming the field, its length and the limit.
fn at_most(field: &str, s: &str, max: usize) -> Result<(), ManifestError> {
    if s.len() > max {
        return Err(fe(
            field,
            format!(
                "is {} bytes long; at most {max} are accepted (docs/manifest.md, Limits)",
                s.len()
            ),
        ));
    }
    Ok(())
}

/// Every length limit of the manifest, checked before any other rule (and so before any value
/// is quoted back in an error or stored).
fn check_lengths(raw: &RawManifest, entry: &[(String, RawEntry)]) -> Result<(), ManifestError> {
    at_most("name", &raw.name, MAX_NAME)?;
    at_most("version", &raw.version, MAX_VERSION)?;
    at_most("op", &raw.op, MAX_WORD)?;
    if let Some(s) = &raw.semantics {
        at_most("semantics", s, MAX_WORD)?;
    }
    at_most("description", &raw.description, MAX_DESCRIPTION)?;
    if raw.authors.len() > MAX_AUTHORS {
        return Err(fe(
            "authors",
            format!(
                "lists {} authors; at most {MAX_AUTHORS} are accepted (docs/manifest.md, Limits)",
                raw.authors.len()
            ),
        ));
    }
    for (i, a) in raw.authors.iter().enumerate() {
        at_most(&format!("authors[{i}]"), a, MAX_AUTHOR)?;
    }
    at_most("license", &raw.license, MAX_LICENSE)?;
    at_most("source", &raw.source, MAX_SOURCE_NAME)?;
    for (k, v) in entry {
        at_most("entry", k, MAX_WORD)?;
        match v {
            RawEntry::Symbol(v) => at_most(&format!("entry.{k}"), v, MAX_ENTRY)?,
            RawEntry::Stages(t) => {
                if t.len() > MAX_STAGES {
                    return Err(fe(
                        format!("entry.{k}"),
                        format!(
                            "names {} entries; at most {MAX_STAGES} are accepted",
                            t.len()
                        ),
                    ));
                }
                for (stage, sym) in t {
                    at_most(&format!("entry.{k}"), stage, MAX_WORD)?;
                    at_most(&format!("entry.{k}.{stage}"), sym, MAX_ENTRY)?;
                }
            }
        }
    }
    for (i, a) in raw.constraints.archs.iter().enumerate() {
        at_most(&format!("constraints.archs[{i}]"), a, MAX_WORD)?;
    }
    if let Some(o) = &raw.nvrtc_options {
        if o.len() > MAX_NVRTC_OPTIONS {
            return Err(fe(
                "nvrtc_options",
                format!(
                    "lists {} options; at most {MAX_NVRTC_OPTIONS} are accepted (docs/manifest.md, Limits)",
                    o.len()
                ),
            ));
        }
        for (i, x) in o.iter().enumerate() {
            at_most(&format!("nvrtc_options[{i}]"), x, MAX_NVRTC_OPTION)?;
        }
    }
    if let Some(r) = &raw.runtime {
        at_most("runtime", r, MAX_WORD)?;
    }
    for (i, r) in raw.requires.iter().flatten().enumerate() {
        at_most(&format!("requires[{i}]"), r, MAX_REQUIREMENT)?;
    }
    if let Some(t) = &raw.setup {
        if t.len() > DType::ALL.len() {
            return Err(fe(
                "setup",
                format!(
                    "names {} functions; at most one per dtype ({})",
                    t.len(),
                    DType::ALL.len()
                ),
            ));
        }
        for (k, v) in t {
            at_most("setup", k, MAX_WORD)?;
            at_most(&format!("setup.{k}"), v, MAX_ENTRY)?;
        }
    }
    let caps = raw.capability.as_deref().unwrap_or_default();
    if caps.len() > Capability::ALL.len() {
        return Err(fe(
            "capability",
            format!(
                "lists {} capabilities; there are {} (docs/manifest.md, Limits)",
                caps.len(),
                Capability::ALL.len()
            ),
        ));
    }
    for (i, c) in caps.iter().enumerate() {
        at_most(&format!("capability[{i}].name"), &c.name, MAX_WORD)?;
        at_most(
            &format!("capability[{i}].reason"),
            &c.reason,
            MAX_CAPABILITY_REASON,
        )?;
    }
    Ok(())
}

/// The `[[capability]]` declarations, checked: known names, each once, with a reason; sorted.
fn check_capabilities(
    raw: Option<Vec<RawCapability>>,
    runtime: Runtime,
) -> Result<Vec<DeclaredCapability>, ManifestError> {
    let Some(raw) = raw else {
        return Ok(Vec::new());
    };
    if runtime == Runtime::Python {
        return Err(fe(
            "capability",
            "a Python candidate's code is not audited (it compiles its kernels at run time); remove it",
        ));
    }
    let mut out: Vec<DeclaredCapability> = Vec::with_capacity(raw.len());
    for (i, c) in raw.into_iter().enumerate() {
        let name: Capability = c
            .name
            .parse()
            .map_err(|e: String| fe(format!("capability[{i}].name"), e))?;
        if !name.needs_declaration() {
            return Err(fe(
                format!("capability[{i}].name"),
                format!("`{name}` needs no declaration: what inline assembly does is audited as PTX like the rest of the code; remove it"),
            ));
        }
        if out.iter().any(|d| d.name == name) {
            return Err(fe(
                format!("capability[{i}].name"),
                format!("`{name}` is declared twice"),
            ));
        }
        let reason = c.reason.trim().to_string();
        if reason.is_empty() {
            return Err(fe(
                format!("capability[{i}].reason"),
                format!("say why the kernel needs `{name}` (a user reads it before allowing it)"),
            ));
        }
        out.push(DeclaredCapability { name, reason });
    }
    out.sort();
    Ok(out)
}

/// `license` is an SPDX license expression (<https://spdx.org/licenses/>): identifiers from
/// the SPDX list joined by AND, OR and WITH, as the `spdx` crate parses them strictly.
pub fn check_license(license: &str) -> Result<(), ManifestError> {
    let l = license.trim();
    if l.is_empty() {
        return Err(fe(
            "license",
            "give an SPDX license expression, e.g. `Apache-2.0` or `MIT`",
        ));
    }
    spdx::Expression::parse(l).map(|_| ()).map_err(|e| {
        fe(
            "license",
            format!(
                "`{l}` is not an SPDX license expression ({}); write identifiers from https://spdx.org/licenses/ joined by AND, OR or WITH, e.g. `Apache-2.0` or `MIT OR Apache-2.0`",
                e.reason
            ),
        )
    })
}

/// A CUDA kernel's `[entry]`: per dtype a symbol (a forward op), or a table naming each of the
/// op's [`Op::stages`] (a backward op). Returns `entries` (each dtype's first stage) and, for a
/// backward op, every stage's symbol.
#[allow(clippy::type_complexity)]
fn check_entries(
    op: Op,
    entry: Vec<(String, RawEntry)>,
) -> Result<
    (
        BTreeMap<DType, String>,
        BTreeMap<DType, BTreeMap<String, String>>,
    ),
    ManifestError,
> {
    let want: Vec<&str> = op.stages().iter().map(|s| s.name).collect();
    let symbol = |field: String, v: &str| {
        if is_identifier(v) {
            Ok(())
        } else {
            Err(fe(
                field,
                format!("`{v}` is not a C identifier; name the `extern \"C\" __global__` function"),
            ))
        }
    };
    let mut entries = BTreeMap::new();
    let mut stages = BTreeMap::new();
    for (k, v) in entry {
        let dt: DType = k
            .parse()
            .map_err(|e| fe(format!("entry.{k}"), format!("{e}")))?;
        match (v, op.is_backward()) {
            (RawEntry::Symbol(v), false) => {
                symbol(format!("entry.{k}"), &v)?;
                entries.insert(dt, v);
            }
            (RawEntry::Stages(_), false) => {
                return Err(fe(
                    format!("entry.{k}"),
                    format!("{op} has one entry per dtype: write `{k} = \"my_kernel_{k}\"` under `[entry]` (tables of entries are for backward ops)"),
                ))
            }
            (RawEntry::Symbol(_), true) => {
                return Err(fe(
                    format!("entry.{k}"),
                    format!(
                        "{op} launches {} entries in this order: give a table `[entry.{k}]` naming each ({})",
                        want.len(),
                        want.iter().map(|s| format!("{s} = \"...\"")).collect::<Vec<_>>().join(", ")
                    ),
                ))
            }
            (RawEntry::Stages(t), true) => {
                if let Some(extra) = t.keys().find(|s| !want.contains(&s.as_str())) {
                    return Err(fe(
                        format!("entry.{k}.{extra}"),
                        format!("{op} has no entry `{extra}`; its entries are {}", want.join(", ")),
                    ));
                }
                if let Some(missing) = want.iter().find(|s| !t.contains_key(**s)) {
                    return Err(fe(
                        format!("entry.{k}.{missing}"),
                        format!("is missing: {op} launches {} in this order (docs/spec.md section 2c)", want.join(", ")),
                    ));
                }
                for (stage, sym) in &t {
                    symbol(format!("entry.{k}.{stage}"), sym)?;
                }
                let mut seen = std::collections::BTreeSet::new();
                if let Some((stage, sym)) = t.iter().find(|(_, sym)| !seen.insert(sym.as_str())) {
                    return Err(fe(
                        format!("entry.{k}.{stage}"),
                        format!("`{sym}` is named for two entries; each entry is its own function"),
                    ));
                }
                entries.insert(dt, t[want[0]].clone());
                stages.insert(dt, t);
            }
        }
    }
    Ok((entries, stages))
}

fn is_identifier(s: &str) -> bool {
    let mut b = s.bytes();
    matches!(b.next(), Some(c) if c == b'_' || c.is_ascii_alphabetic())
        && b.all(|c| c == b'_' || c.is_ascii_alphanumeric())
}

impl Manifest {
    /// Parse and check a `kernel.toml`.
    pub fn parse(text: &str) -> Result<Manifest, ManifestError> {
        if text.len() > MAX_MANIFEST_BYTES {
            return Err(ManifestError::Syntax(format!(
                "manifest is {} bytes; at most {MAX_MANIFEST_BYTES} are accepted",
                text.len()
            )));
        }
        if let Some(at) = text.find('\0') {
            return Err(ManifestError::Syntax(format!(
                "the manifest holds a NUL byte at byte {at}; kernel.toml is text"
            )));
        }
        let raw: RawManifest = toml::from_str(text).map_err(|e| {
            let msg = e.message().trim().to_string();
            let at = e
                .span()
                .map(|s| {
                    let start = s.start.min(text.len());
                    let line_no = text[..start].matches('\n').count() + 1;
                    let line = text.lines().nth(line_no - 1).unwrap_or("").trim();
                    format!(" (line {line_no}: `{line}`)")
                })
                .unwrap_or_default();
            ManifestError::Syntax(format!("{msg}{at}"))
        })?;
        Self::check(raw)
    }

    fn check(mut raw: RawManifest) -> Result<Manifest, ManifestError> {
        let entry = raw_entries(std::mem::take(&mut raw.entry))?;
        check_lengths(&raw, &entry)?;
        // Every free-text field first: a control character is refused naming its field
        // before any other rule quotes the value back.
        plain_text("name", &raw.name, false)?;
        plain_text("version", &raw.version, false)?;
        plain_text("op", &raw.op, false)?;
        if let Some(s) = &raw.semantics {
            plain_text("semantics", s, false)?;
        }
        plain_text("description", &raw.description, true)?;
        for (i, a) in raw.authors.iter().enumerate() {
            plain_text(&format!("authors[{i}]"), a, false)?;
        }
        plain_text("license", &raw.license, false)?;
        plain_text("source", &raw.source, false)?;
        for (k, v) in &entry {
            plain_text("entry", k, false)?;
            match v {
                RawEntry::Symbol(v) => plain_text(&format!("entry.{k}"), v, false)?,
                RawEntry::Stages(t) => {
                    for (stage, sym) in t {
                        plain_text(&format!("entry.{k}"), stage, false)?;
                        plain_text(&format!("entry.{k}.{stage}"), sym, false)?;
                    }
                }
            }
        }
        for (i, a) in raw.constraints.archs.iter().enumerate() {
            plain_text(&format!("constraints.archs[{i}]"), a, false)?;
        }
        for (i, o) in raw.nvrtc_options.iter().flatten().enumerate() {
            plain_text(&format!("nvrtc_options[{i}]"), o, false)?;
        }
        if let Some(r) = &raw.runtime {
            plain_text("runtime", r, false)?;
        }
        for (i, r) in raw.requires.iter().flatten().enumerate() {
            plain_text(&format!("requires[{i}]"), r, false)?;
        }
        for (k, v) in raw.setup.iter().flatten() {
            plain_text("setup", k, false)?;
            plain_text(&format!("setup.{k}"), v, false)?;
        }
        for (i, c) in raw.capability.iter().flatten().enumerate() {
            plain_text(&format!("capability[{i}].name"), &c.name, false)?;
            plain_text(&format!("capability[{i}].reason"), &c.reason, true)?;
        }
        let runtime = match raw.runtime.as_deref() {
            None | Some("cuda") => Runtime::Cuda,
            Some("python") => Runtime::Python,
            Some(other) => {
                return Err(fe(
                    "runtime",
                    format!("`{other}` is not valid: one of cuda, python"),
                ))
            }
        };
        let name_ok = !raw.name.is_empty()
            && raw.name.len() <= MAX_NAME
            && raw.name.bytes().enumerate().all(|(i, c)| {
                c.is_ascii_lowercase()
                    || c.is_ascii_digit()
                    || c == b'_'
                    || (i > 0 && (c == b'-' || c == b'.'))
            });
        if !name_ok {
            return Err(fe(
                "name",
                format!(
                    "`{}` is not allowed: use 1-64 characters of a-z, 0-9 and _ (and - or . after the first), e.g. `rms_norm_llama_fast`",
                    raw.name
                ),
            ));
        }
        let version = semver::Version::parse(&raw.version).map_err(|e| {
            fe(
                "version",
                format!(
                    "`{}` is not a semantic version ({e}); write e.g. `1.0.0`",
                    raw.version
                ),
            )
        })?;
        let op: Op = raw.op.parse().map_err(|e| fe("op", format!("{e}")))?;
        let semantics = match &raw.semantics {
            None => op.default_semantics(),
            Some(s) => {
                let s: Semantics = s.parse().map_err(|e| fe("semantics", format!("{e}")))?;
                op.check_semantics(s)
                    .map_err(|e| fe("semantics", format!("{e}")))?
            }
        };
        if raw.description.trim().is_empty() {
            return Err(fe(
                "description",
                "must say what the kernel computes and how it differs from eager, if it does",
            ));
        }
        if raw.authors.is_empty() || raw.authors.iter().any(|a| a.trim().is_empty()) {
            return Err(fe("authors", "list at least one author, none empty"));
        }
        check_license(&raw.license)?;
        let ext = match runtime {
            Runtime::Cuda => "cu",
            Runtime::Python => "py",
        };
        let src_ok = raw.source.ends_with(&format!(".{ext}"))
            && !raw.source.contains('/')
            && !raw.source.contains('\\')
            && !raw.source.starts_with('.');
        if !src_ok {
            return Err(fe(
                "source",
                format!(
                    "`{}` must be a `.{ext}` file name in the kernel's folder (no path), e.g. `kernel.{ext}` (runtime = \"{runtime}\")",
                    raw.source
                ),
            ));
        }
        let capabilities = check_capabilities(raw.capability.take(), runtime)?;
        // A Python candidate of a backward op names one function per dtype as a forward one
        // does (its signature, docs/spec.md section 2b: the stages' inputs, returning the
        // gradients), not a table of stages: the function launches what it likes.
        if runtime == Runtime::Python {
            let mut symbols = BTreeMap::new();
            for (k, v) in entry {
                match v {
                    RawEntry::Symbol(v) => symbols.insert(k, v),
                    RawEntry::Stages(_) => {
                        return Err(fe(
                            format!("entry.{k}"),
                            format!("name one Python function, e.g. `{k} = \"{op}\"` (a Python candidate of a backward op too: it returns every gradient)"),
                        ))
                    }
                };
            }
            return Self::check_python(raw, symbols, version, op, semantics);
        }
        if raw.requires.is_some() {
            return Err(fe(
                "requires",
                "only a Python candidate (runtime = \"python\") names Python packages; remove it",
            ));
        }
        if raw.setup.is_some() {
            return Err(fe(
                "setup",
                "only a Python candidate of a backward op has a setup function (a CUDA kernel's stages are its entries); remove it",
            ));
        }

        if entry.is_empty() {
            return Err(fe(
                "entry",
                "declare one entry symbol per supported dtype, e.g. `[entry]\\nbf16 = \"my_kernel_bf16\"`",
            ));
        }
        let (entries, stages) = check_entries(op, entry)?;
        if op.is_backward() {
            if raw.launch.is_some() {
                return Err(fe(
                    "launch",
                    format!("{op}'s launches are its ABI's (docs/spec.md section 2c: each entry's block, its grid from the problem: kernel_registry::backward::stage_dims); remove it"),
                ));
            }
            raw.launch = Some(toml::Value::Array(Vec::new()));
        }

        // `[launch]` (one rule) or `[[launch]]` (several); parsed by hand so that an error
        // names the rule and field rather than "no variant matched".
        let parse_rule = |v: toml::Value, at: String| -> Result<RawLaunch, ManifestError> {
            serde_path_to_error::deserialize::<_, RawLaunch>(v).map_err(|e| {
                let path = e.path().to_string();
                let field = if path == "." {
                    at.clone()
                } else {
                    format!("{at}.{path}")
                };
                ManifestError::Syntax(format!("`{field}`: {}", e.inner().message().trim()))
            })
        };
        let Some(launch_value) = raw.launch else {
            return Err(fe(
                "launch",
                "a CUDA kernel needs launch rules: `[launch]` or `[[launch]]` (docs/manifest.md)",
            ));
        };
        let raws = match launch_value {
            toml::Value::Table(t) => vec![parse_rule(toml::Value::Table(t), "launch".into())?],
            toml::Value::Array(a) => a
                .into_iter()
                .enumerate()
                .map(|(i, v)| parse_rule(v, format!("launch[{i}]")))
                .collect::<Result<_, _>>()?,
            _ => {
                return Err(fe(
                    "launch",
                    "must be a table `[launch]` or tables `[[launch]]`",
                ))
            }
        };
        if raws.is_empty() && !op.is_backward() {
            return Err(fe("launch", "give at least one launch rule"));
        }
        let n = raws.len();
        let mut launch = Vec::with_capacity(n);
        let mut prev_max = 0u64;
        for (i, l) in raws.into_iter().enumerate() {
            let at = |k: &str| {
                if n == 1 {
                    format!("launch.{k}")
                } else {
                    format!("launch[{i}].{k}")
                }
            };
            let bad_block = || {
                fe(
                    at("block"),
                    "give 1 to 3 block dimensions, e.g. `256` or `[32, 8]`",
                )
            };
            let dim = |v: &toml::Value| {
                v.as_integer()
                    .and_then(|x| u32::try_from(x).ok())
                    .ok_or_else(bad_block)
            };
            let block = match &l.block {
                toml::Value::Integer(_) => [dim(&l.block)?, 1, 1],
                toml::Value::Array(v) if (1..=3).contains(&v.len()) => {
                    let mut b = [1u32; 3];
                    for (slot, x) in b.iter_mut().zip(v) {
                        *slot = dim(x)?;
                    }
                    b
                }
                _ => return Err(bad_block()),
            };
            let threads: u64 = block.iter().map(|&d| d as u64).product();
            if block.contains(&0) || threads > 1024 || block[2] > 64 {
                return Err(fe(
                    at("block"),
                    format!("{block:?} is not a valid CUDA block: every dimension >= 1, z <= 64, at most 1024 threads in all"),
                ));
            }
            let extra = |k: &str, name: &str| {
                fe(
                    at(k),
                    format!("is not used with grid = \"{name}\"; remove it"),
                )
            };
            let positive = |k: &str, v: Option<u32>| -> Result<u32, ManifestError> {
                match v {
                    Some(x) if x >= 1 => Ok(x),
                    Some(_) => Err(fe(at(k), "must be at least 1")),
                    None => Err(fe(at(k), "is required for this grid")),
                }
            };
            let grid = match l.grid.as_str() {
                "per_row" => {
                    if l.elements_per_thread.is_some() {
                        return Err(extra("elements_per_thread", "per_row"));
                    }
                    if l.blocks_per_sm.is_some() {
                        return Err(extra("blocks_per_sm", "per_row"));
                    }
                    Grid::PerRow {
                        rows_per_block: positive("rows_per_block", l.rows_per_block.or(Some(1)))?,
                    }
                }
                "per_element" => {
                    if l.rows_per_block.is_some() {
                        return Err(extra("rows_per_block", "per_element"));
                    }
                    if l.blocks_per_sm.is_some() {
                        return Err(extra("blocks_per_sm", "per_element"));
                    }
                    Grid::PerElement {
                        elements_per_thread: positive(
                            "elements_per_thread",
                            l.elements_per_thread.or(Some(1)),
                        )?,
                    }
                }
                "persistent" => {
                    if l.rows_per_block.is_some() {
                        return Err(extra("rows_per_block", "persistent"));
                    }
                    if l.elements_per_thread.is_some() {
                        return Err(extra("elements_per_thread", "persistent"));
                    }
                    Grid::Persistent {
                        blocks_per_sm: positive("blocks_per_sm", l.blocks_per_sm)?,
                    }
                }
                other => {
                    return Err(fe(
                        at("grid"),
                        format!("`{other}` is not valid: one of per_row, per_element, persistent"),
                    ))
                }
            };
            match (l.cols_max, i + 1 == n) {
                (Some(_), true) if n > 1 => return Err(fe(
                    at("cols_max"),
                    "the last launch rule must cover all larger problems: leave out its cols_max",
                )),
                (None, false) => return Err(fe(
                    at("cols_max"),
                    "every launch rule but the last needs cols_max (the rules are tried in order)",
                )),
                (Some(m), _) if m <= prev_max => {
                    return Err(fe(
                        at("cols_max"),
                        "must be larger than the previous rule's cols_max",
                    ))
                }
                (Some(m), _) => prev_max = m,
                _ => {}
            }
            if l.smem_bytes as u64 + l.smem_bytes_per_col as u64 * 65536 > (227 << 10) * 4 {
                return Err(fe(
                    at("smem_bytes"),
                    "asks for far more shared memory than any GPU has",
                ));
            }
            launch.push(LaunchRule {
                cols_max: l.cols_max,
                block,
                grid,
                smem_bytes: l.smem_bytes,
                smem_bytes_per_col: l.smem_bytes_per_col,
            });
        }

        let c = raw.constraints;
        let cols_min = c.cols_min.unwrap_or(1);
        let cols_multiple_of = c.cols_multiple_of.unwrap_or(1);
        if cols_min == 0 {
            return Err(fe("constraints.cols_min", "must be at least 1"));
        }
        if cols_multiple_of == 0 {
            return Err(fe("constraints.cols_multiple_of", "must be at least 1"));
        }
        if let Some(max) = c.cols_max {
            if max < cols_min {
                return Err(fe(
                    "constraints.cols_max",
                    format!("{max} is below cols_min {cols_min}"),
                ));
            }
        }
        let mut archs = Vec::new();
        for (i, a) in c.archs.iter().enumerate() {
            archs.push(
                a.parse::<Arch>()
                    .map_err(|e| fe(format!("constraints.archs[{i}]"), format!("{e}")))?,
            );
        }
        archs.sort();
        archs.dedup();

        let nvrtc_options = raw.nvrtc_options.unwrap_or_default();
        for (i, o) in nvrtc_options.iter().enumerate() {
            let defined = o
                .strip_prefix("--define-macro=")
                .or_else(|| o.strip_prefix("-D"))
                .unwrap_or("");
            if defined.starts_with("KERNELIZE_") {
                return Err(fe(
                    format!("nvrtc_options[{i}]"),
                    format!(
                        "`{o}`: macros named KERNELIZE_* are the verifier's; it defines KERNELIZE_DTYPE_<DTYPE> for each entry's module itself (docs/manifest.md)"
                    ),
                ));
            }
            if !ALLOWED_OPTION_PREFIXES.iter().any(|p| o.starts_with(p))
                && !is_ptxas_threads_option(o)
            {
                return Err(fe(
                    format!("nvrtc_options[{i}]"),
                    format!(
                        "`{o}` is not allowed; the verifier sets the architecture and include paths. Allowed: {} -Xptxas=--split-compile=N",
                        ALLOWED_OPTION_PREFIXES.join(" ")
                    ),
                ));
            }
        }

        Ok(Manifest {
            name: raw.name,
            version,
            op,
            semantics,
            description: raw.description.trim().to_string(),
            authors: raw.authors,
            license: raw.license.trim().to_string(),
            source: raw.source,
            entries,
            launch,
            constraints: Constraints {
                cols_min,
                cols_max: c.cols_max,
                cols_multiple_of,
                archs,
            },
            nvrtc_options,
            runtime: Runtime::Cuda,
            requires: Vec::new(),
            capabilities,
            stages,
            setup: BTreeMap::new(),
        })
    }

    /// The rest of `check` for `runtime = "python"`: entries are Python function names, no
    /// launch rules or NVRTC options, and `requires` lists the packages with versions.
    fn check_python(
        mut raw: RawManifest,
        entry: BTreeMap<String, String>,
        version: semver::Version,
        op: Op,
        semantics: Semantics,
    ) -> Result<Manifest, ManifestError> {
        if raw.launch.is_some() {
            return Err(fe(
                "launch",
                "a Python candidate has no launch rules (the function launches its own kernels); remove it",
            ));
        }
        if raw.nvrtc_options.is_some() {
            return Err(fe(
                "nvrtc_options",
                "a Python candidate is not compiled by NVRTC; remove it",
            ));
        }
        if entry.is_empty() {
            return Err(fe(
                "entry",
                "name one Python function per supported dtype, e.g. `[entry]\\nbf16 = \"rms_norm\"`",
            ));
        }
        let mut entries = BTreeMap::new();
        for (k, v) in &entry {
            let dt: DType = k
                .parse()
                .map_err(|e| fe(format!("entry.{k}"), format!("{e}")))?;
            if !is_identifier(v) || v.starts_with("__") {
                return Err(fe(
                    format!("entry.{k}"),
                    format!("`{v}` is not a Python function name (ASCII letters, digits and _, not starting with a digit or __)"),
                ));
            }
            entries.insert(dt, v.clone());
        }
        let setup = check_setup(raw.setup.take(), &entries, op)?;
        let Some(requires) = raw.requires else {
            return Err(fe(
                "requires",
                "list the Python packages the source imports, with versions, e.g. `requires = [\"torch>=2.5\"]`",
            ));
        };
        if requires.is_empty() || requires.len() > MAX_REQUIRES {
            return Err(fe(
                "requires",
                format!("list 1 to {MAX_REQUIRES} packages (at least the torch the source was written for)"),
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, r) in requires.iter().enumerate() {
            let name = check_requirement(r).map_err(|m| fe(format!("requires[{i}]"), m))?;
            if !seen.insert(name.clone()) {
                return Err(fe(
                    format!("requires[{i}]"),
                    format!("package `{name}` is listed twice"),
                ));
            }
        }
        let c = raw.constraints;
        let cols_min = c.cols_min.unwrap_or(1);
        let cols_multiple_of = c.cols_multiple_of.unwrap_or(1);
        if cols_min == 0 {
            return Err(fe("constraints.cols_min", "must be at least 1"));
        }
        if cols_multiple_of == 0 {
            return Err(fe("constraints.cols_multiple_of", "must be at least 1"));
        }
        if let Some(max) = c.cols_max {
            if max < cols_min {
                return Err(fe(
                    "constraints.cols_max",
                    format!("{max} is below cols_min {cols_min}"),
                ));
            }
        }
        let mut archs = Vec::new();
        for (i, a) in c.archs.iter().enumerate() {
            archs.push(
                a.parse::<Arch>()
                    .map_err(|e| fe(format!("constraints.archs[{i}]"), format!("{e}")))?,
            );
        }
        archs.sort();
        archs.dedup();
        Ok(Manifest {
            name: raw.name,
            version,
            op,
            semantics,
            description: raw.description.trim().to_string(),
            authors: raw.authors,
            license: raw.license.trim().to_string(),
            source: raw.source,
            entries,
            launch: Vec::new(),
            constraints: Constraints {
                cols_min,
                cols_max: c.cols_max,
                cols_multiple_of,
                archs,
            },
            nvrtc_options: Vec::new(),
            runtime: Runtime::Python,
            requires,
            capabilities: Vec::new(),
            stages: BTreeMap::new(),
            setup,
        })
    }

    pub fn dtypes(&self) -> Vec<DType> {
        self.entries.keys().copied().collect()
    }

    /// Why a problem with `cols` columns (elements, for elementwise ops) on `arch` is outside
    /// this kernel's declared constraints; `None` when it is inside.
    pub fn not_applicable(&self, cols: u64, arch: Option<Arch>) -> Option<String> {
        self.constraints.not_applicable(cols, arch)
    }

    /// The launch rule for a problem with `cols` columns; `None` for a Python candidate.
    pub fn launch_rule(&self, cols: u64) -> Option<&LaunchRule> {
        self.launch
            .iter()
            .find(|r| r.cols_max.is_none_or(|m| cols <= m))
            .or(self.launch.last())
    }

    /// The package name of each `requires` entry (normalised as pip does: lowercase, `-`).
    pub fn required_packages(&self) -> Vec<String> {
        self.requires
            .iter()
            .filter_map(|r| check_requirement(r).ok())
            .collect()
    }

    /// Grid, block and dynamic shared memory for `rows` x `cols` (for elementwise ops the
    /// element count is `rows * cols`). Fails when the grid would exceed CUDA's limits.
    pub fn launch_dims(&self, rows: u64, cols: u64, sm_count: u32) -> Result<LaunchDims, String> {
        if self.op.is_backward() {
            return Err(format!(
                "{} is a {} kernel: its entries are launched by the ABI (kernel_registry::backward::stage_dims), not by launch rules",
                self.name, self.op
            ));
        }
        let Some(rule) = self.launch_rule(cols) else {
            return Err(format!(
                "{} is a {} candidate: it has no launch rules",
                self.name, self.runtime
            ));
        };
        let threads = rule.block.iter().map(|&d| d as u64).product::<u64>();
        let blocks = match rule.grid {
            Grid::PerRow { rows_per_block } => rows.div_ceil(rows_per_block as u64),
            Grid::PerElement {
                elements_per_thread,
            } => (rows * cols).div_ceil(threads * elements_per_thread as u64),
            Grid::Persistent { blocks_per_sm } => blocks_per_sm as u64 * sm_count as u64,
        }
        .max(1);
        if blocks > i32::MAX as u64 {
            return Err(format!(
                "grid of {blocks} blocks exceeds CUDA's limit of 2^31-1"
            ));
        }
        let smem = rule.smem_bytes as u64 + rule.smem_bytes_per_col as u64 * cols;
        let shared_mem_bytes =
            u32::try_from(smem).map_err(|_| format!("{smem} bytes of shared memory"))?;
        Ok(LaunchDims {
            grid: [blocks as u32, 1, 1],
            block: rule.block,
            shared_mem_bytes,
        })
    }
}

/// A kernel as stored and verified: its manifest (checked and as written) and its source.
#[derive(Debug, Clone)]
pub struct KernelBundle {
    pub manifest: Manifest,
    pub manifest_toml: String,
    pub source: String,
}

impl KernelBundle {
    pub fn from_parts(manifest_toml: &str, source: &str) -> Result<Self, ManifestError> {
        let manifest = Manifest::parse(manifest_toml)?;
        if source.len() > MAX_SOURCE_BYTES {
            return Err(ManifestError::field(
                "source",
                format!(
                    "the source is {} bytes; at most {MAX_SOURCE_BYTES} are accepted",
                    source.len()
                ),
            ));
        }
        if source.trim().is_empty() {
            return Err(ManifestError::field("source", "the source file is empty"));
        }
        if let Some(at) = source.find('\0') {
            return Err(ManifestError::field(
                "source",
                format!("the source holds a NUL byte at byte {at}; a source is text"),
            ));
        }
        for (dt, t) in &manifest.stages {
            for (stage, sym) in t {
                if !source.contains(sym.as_str()) {
                    return Err(ManifestError::field(
                        format!("entry.{dt}.{stage}"),
                        format!("symbol `{sym}` does not appear in {}", manifest.source),
                    ));
                }
            }
        }
        for (dt, sym) in &manifest.entries {
            if manifest.runtime == Runtime::Python && !defines_function(source, sym) {
                return Err(ManifestError::field(
                    format!("entry.{dt}"),
                    format!(
                        "function `{sym}` is not defined (`def {sym}(` at the start of a line) in {}",
                        manifest.source
                    ),
                ));
            }
            if !source.contains(sym.as_str()) {
                return Err(ManifestError::field(
                    format!("entry.{dt}"),
                    format!("symbol `{sym}` does not appear in {}", manifest.source),
                ));
            }
        }
        for (dt, f) in &manifest.setup {
            if !defines_function(source, f) {
                return Err(ManifestError::field(
                    format!("setup.{dt}"),
                    format!(
                        "function `{f}` is not defined (`def {f}(` at the start of a line) in {}",
                        manifest.source
                    ),
                ));
            }
        }
        Ok(KernelBundle {
            manifest,
            manifest_toml: manifest_toml.to_string(),
            source: source.to_string(),
        })
    }

    /// Read `DIR/kernel.toml` and the source file it names (`.cu` or `.py`).
    pub fn load_dir(dir: &Path) -> Result<Self, ManifestError> {
        let mpath = dir.join("kernel.toml");
        let text = std::fs::read_to_string(&mpath).map_err(|e| {
            ManifestError::Io(format!(
                "cannot read {}: {e} (a kernel folder holds kernel.toml and its .cu source)",
                mpath.display()
            ))
        })?;
        let manifest = Manifest::parse(&text).map_err(|e| match e {
            ManifestError::Syntax(m) => ManifestError::Syntax(format!("{}: {m}", mpath.display())),
            other => other,
        })?;
        let spath = dir.join(&manifest.source);
        let source = std::fs::read_to_string(&spath).map_err(|e| {
            ManifestError::field("source", format!("cannot read {}: {e}", spath.display()))
        })?;
        Self::from_parts(&text, &source)
    }

    /// The content digest: sha256 over the canonical manifest encoding and the source bytes.
    /// Comments and layout of kernel.toml do not change it; any value or source byte does.
    pub fn digest(&self) -> Digest {
        digest_of(&self.manifest, &self.source)
    }
}

/// Whether a Python source defines `name` at module level (`def name(` starting a line).
fn defines_function(source: &str, name: &str) -> bool {
    let want = format!("def {name}(");
    source.lines().any(|l| l.starts_with(&want))
}

/// Check one `requires` entry, `name` then comma-separated version specifiers, each an
/// operator (`==`, `>=`, `<=`, `~=`, `!=`, `<`, `>`) and a version (`liger-kernel==0.8.5`,
/// `torch>=2.5,<3`); returns the package name normalised as pip does (lowercase, runs of
/// `-_.` as `-`). Markers, extras and URLs are refused: the verifier installs nothing itself.
pub fn check_requirement(r: &str) -> Result<String, String> {
    let hint = "write `name` and version specifiers, e.g. `liger-kernel==0.8.5` or `torch>=2.5,<3`";
    let end = r
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
        .unwrap_or(r.len());
    let (name, rest) = r.split_at(end);
    let name_ok = !name.is_empty()
        && name.len() <= 100
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if !name_ok {
        return Err(format!("`{r}`: the package name is not valid; {hint}"));
    }
    if rest.trim().is_empty() {
        return Err(format!(
            "`{r}` gives no version; say which versions the source was written for, e.g. `{name}==1.2.3`"
        ));
    }
    for spec in rest.split(',') {
        let spec = spec.trim();
        let op_len = ["==", ">=", "<=", "~=", "!=", "<", ">"]
            .iter()
            .find(|o| spec.starts_with(*o))
            .map(|o| o.len());
        let Some(op_len) = op_len else {
            return Err(format!(
                "`{r}`: `{spec}` is not a version specifier; {hint}"
            ));
        };
        let v = spec[op_len..].trim();
        let v_ok = !v.is_empty()
            && v.starts_with(|c: char| c.is_ascii_digit())
            && v.chars().all(|c| {
                c.is_ascii_alphanumeric() || matches!(c, '.' | '*' | '+' | '!' | '-' | '_')
            });
        if !v_ok {
            return Err(format!("`{r}`: `{v}` is not a version; {hint}"));
        }
    }
    let mut norm = String::with_capacity(name.len());
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !norm.ends_with('-') {
                norm.push('-');
            }
        } else {
            norm.push(c.to_ascii_lowercase());
        }
    }
    Ok(norm)
}

/// The canonical encoding hashed for a digest.
pub fn digest_of(manifest: &Manifest, source: &str) -> Digest {
    let m = serde_json::to_vec(manifest).expect("manifest serialises");
    let mut buf = Vec::with_capacity(m.len() + source.len() + 40);
    buf.extend_from_slice(b"kernelize-kernel-v1\0");
    buf.extend_from_slice(&(m.len() as u64).to_le_bytes());
    buf.extend_from_slice(&m);
    buf.extend_from_slice(&(source.len() as u64).to_le_bytes());
    buf.extend_from_slice(source.as_bytes());
    Digest::of_bytes(&buf)
}

#[cfg(test)]
mod tests;
