//! The capability audit (docs/spec.md section 3b): what the exact compiled code of a kernel is
//! able to do, read from the PTX that NVRTC made the certified CUBIN from.
//!
//! A run of finite length cannot see a kernel that changes behaviour after many launches or
//! after some time; the audit sees that it *could*: it reads a clock, reads registers that
//! differ from launch to launch or from SM to SM, keeps data in module-scope memory (or the
//! device heap) that outlives a launch, and so on. [`audit_ptx`] is a pure function over PTX
//! text; the verifier runs it on the PTX of every module it compiles and puts the result in
//! the report ([`CapabilityReport`], certified with the report). The policy
//! (`crate::policy`) refuses, by default, a kernel whose audit finds a gated capability
//! ([`Capability::gated`]: `clock`, `environment`, `state`) unless the policy asks for it
//! (`allow:clock`), and under every policy a kernel whose audit finds a capability its
//! manifest does not declare (`[[capability]]`, docs/manifest.md).
//!
//! The PTX is tokenised, not searched: comments and string literals are removed first,
//! statements are split at `;`, `{` and `}`, and each instruction's opcode and operands are
//! read apart, so that a function named `myclock` or a comment mentioning `%clock` finds
//! nothing. Inline assembly is pasted into the PTX verbatim, so its instructions are audited
//! like any other; the compiler marks each block with a `// begin inline asm` comment, which
//! is how [`Capability::InlineAsm`] is found (it needs no declaration: what the block does is
//! audited as PTX).

use crate::domain::DType;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::str::FromStr;

/// One thing compiled code can do, by its stable snake_case name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Capability {
    /// Reads a clock, timer or performance counter: `%clock`, `%clock_hi`, `%clock64`,
    /// `%globaltimer`, `%globaltimer_lo`, `%globaltimer_hi`, `%pm0`..`%pm7` (and `_64`).
    Clock,
    /// Reads a register whose value depends on where or when the code runs rather than on the
    /// launch's shape: `%smid`, `%nsmid`, `%warpid`, `%nwarpid`, `%gridid` (a number per
    /// launch), `%envreg0`..`%envreg31`, `%current_graph_exec` (whether it runs in a CUDA
    /// graph), and any special register this audit does not know.
    Environment,
    /// Keeps state that outlives a launch: a store, atomic or reduction to a module-scope
    /// `.global` variable (or an address of one that escapes into memory or a call), or a
    /// device-heap allocation (`malloc`).
    State,
    /// Atomics or reductions on global (or generic) addresses: `atom`, `red`,
    /// `cp.reduce.async.bulk` and `multimem.red` not on shared memory.
    GlobalAtomics,
    /// Calls `vprintf` (device `printf`) or `__assertfail` (`assert`).
    Printf,
    /// Executes `trap` or `brkpt`, or calls `__assertfail` (`assert`).
    Trap,
    /// Launches kernels from the device (dynamic parallelism): calls `cudaLaunchDevice`,
    /// `cudaGetParameterBuffer` or another device-runtime `cuda*` function.
    DynamicParallelism,
    /// Calls through a register (a function pointer or virtual call).
    IndirectCall,
    /// Holds inline assembly (found by the compiler's `// begin inline asm` markers). Its
    /// instructions are audited like the rest of the PTX, so it needs no declaration.
    InlineAsm,
}

impl Capability {
    pub const ALL: [Capability; 9] = [
        Capability::Clock,
        Capability::Environment,
        Capability::State,
        Capability::GlobalAtomics,
        Capability::Printf,
        Capability::Trap,
        Capability::DynamicParallelism,
        Capability::IndirectCall,
        Capability::InlineAsm,
    ];

    /// Capabilities a default policy refuses: the kernel may behave differently later in the
    /// life of a process (after some time, after many launches, on another SM or in a CUDA
    /// graph) than in any run of finite length. A policy hands such a kernel out only when it
    /// asks for each of them (`allow:NAME`).
    pub const GATED: [Capability; 3] = [
        Capability::Clock,
        Capability::Environment,
        Capability::State,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Capability::Clock => "clock",
            Capability::Environment => "environment",
            Capability::State => "state",
            Capability::GlobalAtomics => "global_atomics",
            Capability::Printf => "printf",
            Capability::Trap => "trap",
            Capability::DynamicParallelism => "dynamic_parallelism",
            Capability::IndirectCall => "indirect_call",
            Capability::InlineAsm => "inline_asm",
        }
    }

    /// Refused by a default policy (see [`Capability::GATED`]).
    pub fn gated(self) -> bool {
        Self::GATED.contains(&self)
    }

    /// Must be declared in the manifest when found (every capability but `inline_asm`).
    pub fn needs_declaration(self) -> bool {
        self != Capability::InlineAsm
    }

    /// What it means, as a verb phrase: "reads a clock".
    pub fn describe(self) -> &'static str {
        match self {
            Capability::Clock => "reads a clock",
            Capability::Environment => "reads an environment register",
            Capability::State => "keeps state across launches",
            Capability::GlobalAtomics => "uses atomics on global memory",
            Capability::Printf => "calls printf",
            Capability::Trap => "traps",
            Capability::DynamicParallelism => "launches kernels (dynamic parallelism)",
            Capability::IndirectCall => "makes indirect calls",
            Capability::InlineAsm => "contains inline assembly",
        }
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Capability {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Capability::ALL
            .iter()
            .copied()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "`{s}` is not a capability: one of {}",
                    Capability::ALL.map(Capability::as_str).join(", ")
                )
            })
    }
}

/// A capability a manifest declares, and why the kernel needs it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DeclaredCapability {
    pub name: Capability,
    pub reason: String,
}

/// Longest `reason` of a declared capability (bytes).
pub const MAX_CAPABILITY_REASON: usize = 1000;

/// What the audit of one module's PTX found: each capability with its evidence (the register,
/// instruction, called function or variable), sorted and without repeats.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Audit {
    pub found: BTreeMap<Capability, BTreeSet<String>>,
}

impl Audit {
    pub fn has(&self, c: Capability) -> bool {
        self.found.contains_key(&c)
    }
    pub fn capabilities(&self) -> Vec<Capability> {
        self.found.keys().copied().collect()
    }
    fn add(&mut self, c: Capability, evidence: impl Into<String>) {
        self.found.entry(c).or_default().insert(evidence.into());
    }
}

/// One dtype's module and its audit (`Err`: why its PTX could not be audited).
pub type ModuleAudit = (DType, Result<Audit, String>);

/// Most evidence strings kept per capability in a report.
pub const MAX_EVIDENCE: usize = 8;

/// A capability the audit found, with its evidence and the dtypes whose module has it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FoundCapability {
    pub name: Capability,
    /// What gave it away (`%globaltimer`, `trap`, `vprintf`, `st to counter`), at most
    /// [`MAX_EVIDENCE`].
    pub evidence: Vec<String>,
    /// The dtypes whose compiled module has it.
    pub dtypes: Vec<DType>,
}

/// The audit in a verification report (docs/spec.md section 3b).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapabilityReport {
    /// Every compiled module's PTX was audited. `false`: what was not is in `notes` (and the
    /// policy treats the kernel as unaudited).
    pub audited: bool,
    /// What the code can do, sorted by name.
    pub found: Vec<FoundCapability>,
    /// What the manifest declares (`[[capability]]`), sorted by name.
    pub declared: Vec<DeclaredCapability>,
    /// What could not be audited, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl CapabilityReport {
    /// The report of per-dtype audits (`Err`: that module could not be audited, and why).
    pub fn of_modules(
        modules: &[ModuleAudit],
        declared: &[DeclaredCapability],
    ) -> CapabilityReport {
        let mut found: BTreeMap<Capability, (BTreeSet<String>, BTreeSet<DType>)> = BTreeMap::new();
        let mut notes = Vec::new();
        for (dt, a) in modules {
            match a {
                Ok(a) => {
                    for (c, ev) in &a.found {
                        let e = found.entry(*c).or_default();
                        e.0.extend(ev.iter().cloned());
                        e.1.insert(*dt);
                    }
                }
                Err(why) => notes.push(format!("{dt}: not audited: {why}")),
            }
        }
        let mut declared = declared.to_vec();
        declared.sort();
        CapabilityReport {
            audited: notes.is_empty() && !modules.is_empty(),
            found: found
                .into_iter()
                .map(|(name, (ev, dts))| FoundCapability {
                    name,
                    evidence: ev.into_iter().take(MAX_EVIDENCE).collect(),
                    dtypes: dts.into_iter().collect(),
                })
                .collect(),
            declared,
            notes,
        }
    }

    pub fn found_names(&self) -> Vec<Capability> {
        self.found.iter().map(|f| f.name).collect()
    }

    pub fn is_declared(&self, c: Capability) -> bool {
        self.declared.iter().any(|d| d.name == c)
    }

    /// Found, needing a declaration, and not declared.
    pub fn undeclared(&self) -> Vec<&FoundCapability> {
        self.found
            .iter()
            .filter(|f| f.name.needs_declaration() && !self.is_declared(f.name))
            .collect()
    }

    /// The stored flags a policy decides on ([`flags_pass`]): `,name,` per capability found,
    /// with `!` before the name of one found and not declared (`,trap,!clock,`). An audit that
    /// could not read every module ([`CapabilityReport::audited`] false) is [`UNAUDITED_FLAGS`]:
    /// what that code can do is unknown, so every policy refuses it, as an undeclared
    /// capability. (A CUDA report from before the audit stands as [`CapabilityReport::before_audit`]:
    /// [`crate::report::VerificationReport::audit`]. `None`, no audit at all, is a Python
    /// candidate's: refused only under `audited`.)
    pub fn flags(&self) -> Option<String> {
        if !self.audited {
            return Some(UNAUDITED_FLAGS.to_string());
        }
        let mut s = String::from(",");
        for f in &self.found {
            if f.name.needs_declaration() && !self.is_declared(f.name) {
                s.push('!');
            }
            s.push_str(f.name.as_str());
            s.push(',');
        }
        Some(s)
    }
}

/// The stored flags of an audit that could not read every module of a CUDA kernel.
pub const UNAUDITED_FLAGS: &str = ",!unaudited,";

/// Why a CUDA kernel's verification made before the capability audit counts as unaudited
/// ([`CapabilityReport::before_audit`]).
pub const BEFORE_AUDIT: &str = "the verification was made before the capability audit existed, so nothing of its compiled code was read; verify the kernel again (`kernelize verify-request` on a hub, `kernelize verify` locally) to audit it";

impl CapabilityReport {
    /// What a CUDA kernel's verification made before the audit stands for: nothing was read,
    /// so what its code can do is unknown and every policy refuses it, as an audit that could
    /// not read a module (migration 0016 stores the same for such rows).
    pub fn before_audit() -> CapabilityReport {
        CapabilityReport {
            audited: false,
            found: vec![],
            declared: vec![],
            notes: vec![BEFORE_AUDIT.to_string()],
        }
    }
}

/// What a policy says of a verification's audit (`None`: not audited): each reason it refuses
/// it, given the capabilities the policy allows and whether it requires an audit.
pub fn refusals(
    report: Option<&CapabilityReport>,
    allow: &[Capability],
    require_audit: bool,
) -> Vec<String> {
    let mut why = Vec::new();
    if let Some(r) = report.filter(|r| !r.audited) {
        why.push(format!(
            "the compiled code could not be audited ({}): what it can do is unknown, and every policy refuses that",
            if r.notes.is_empty() {
                "no module was read".to_string()
            } else {
                r.notes.join("; ")
            }
        ));
        return why;
    }
    let Some(r) = report else {
        if require_audit {
            why.push(
                "the compiled code was not audited (a verification before the capability audit, or a Python candidate); fails audited"
                    .to_string(),
            );
        }
        return why;
    };
    for f in r.undeclared() {
        why.push(format!(
            "{} ({}) but the manifest does not declare capability `{}`",
            f.name.describe(),
            f.evidence.join(", "),
            f.name
        ));
    }
    for f in &r.found {
        if f.name.gated() && !allow.contains(&f.name) && r.is_declared(f.name) {
            why.push(format!(
                "{} ({}); a policy hands it out only when it asks for it: add `allow:{}`",
                f.name.describe(),
                f.evidence.join(", "),
                f.name
            ));
        }
    }
    why
}

/// The same decision as [`refusals`] over the stored flags ([`CapabilityReport::flags`]), as
/// the verdict index keeps them (`Policy::passes` decides with it; `refusals` words the reasons).
pub fn flags_pass(flags: Option<&str>, allow: &[Capability], require_audit: bool) -> bool {
    let Some(f) = flags else {
        return !require_audit;
    };
    !f.contains('!')
        && Capability::GATED
            .iter()
            .all(|g| allow.contains(g) || !f.contains(&format!(",{g},")))
}

// ---- the PTX audit ------------------------------------------------------------------------

/// Special registers that hold the launch's own shape or a value fixed by it (and by the
/// architecture): reading them is ordinary.
const GEOMETRY: &[&str] = &[
    "%tid",
    "%ntid",
    "%ctaid",
    "%nctaid",
    "%laneid",
    "%lanemask_eq",
    "%lanemask_le",
    "%lanemask_lt",
    "%lanemask_ge",
    "%lanemask_gt",
    "%clusterid",
    "%nclusterid",
    "%cluster_ctaid",
    "%cluster_nctaid",
    "%cluster_ctarank",
    "%cluster_nctarank",
    "%is_explicit_cluster",
    "%dynamic_smem_size",
    "%total_smem_size",
    "%aggr_smem_size",
    "%reserved_smem_offset_begin",
    "%reserved_smem_offset_end",
    "%reserved_smem_offset_cap",
    "%reserved_smem_offset_0",
    "%reserved_smem_offset_1",
];

const CLOCKS: &[&str] = &[
    "%clock",
    "%clock_hi",
    "%clock64",
    "%globaltimer",
    "%globaltimer_lo",
    "%globaltimer_hi",
];

const ENVIRONMENT: &[&str] = &[
    "%smid",
    "%nsmid",
    "%warpid",
    "%nwarpid",
    "%gridid",
    "%current_graph_exec",
];

fn special_register(name: &str) -> Option<Capability> {
    if GEOMETRY.contains(&name) {
        return None;
    }
    if CLOCKS.contains(&name) {
        return Some(Capability::Clock);
    }
    // %pm0..%pm7 and %pm0_64..%pm7_64: performance-monitoring counters.
    if let Some(n) = name.strip_prefix("%pm") {
        let n = n.strip_suffix("_64").unwrap_or(n);
        if n.len() == 1 && n.as_bytes()[0].is_ascii_digit() {
            return Some(Capability::Clock);
        }
    }
    if ENVIRONMENT.contains(&name) || name.starts_with("%envreg") {
        return Some(Capability::Environment);
    }
    // A special register this audit does not know (a newer PTX's): counted as environment,
    // so that nothing unknown passes a default policy.
    Some(Capability::Environment)
}

/// Device-runtime functions that launch work (dynamic parallelism).
fn launches_kernels(callee: &str) -> bool {
    callee.starts_with("cuda") || callee.starts_with("__cudaCDP") || callee.starts_with("cudaCGGet")
}

/// Device-heap functions: an allocation outlives the launch.
const HEAP: &[&str] = &["malloc", "free", "__nv_aligned_device_malloc"];

/// A statement of the PTX with comments and strings removed: its text, whether it is at
/// module scope, and which function body it belongs to.
struct Stmt {
    text: String,
    /// Index of the function body it is in; `None` at module scope.
    func: Option<usize>,
}

/// Remove comments and string literals (a string becomes `""`), keeping line structure.
/// Returns the cleaned text and how many `// begin inline asm` markers it had.
fn strip(ptx: &str) -> (String, usize) {
    let b = ptx.as_bytes();
    let mut out = String::with_capacity(ptx.len());
    let mut asm_blocks = 0;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                let end = ptx[i..].find('\n').map_or(b.len(), |e| i + e);
                if ptx[i + 2..end].trim() == "begin inline asm" {
                    asm_blocks += 1;
                }
                i = end;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let end = ptx[i + 2..].find("*/").map_or(b.len(), |e| i + 2 + e + 2);
                // Keep newlines so statements do not merge across a comment.
                out.extend(ptx[i..end].chars().filter(|&c| c == '\n'));
                out.push(' ');
                i = end;
            }
            b'"' => {
                let mut j = i + 1;
                while j < b.len() && b[j] != b'"' && b[j] != b'\n' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                out.push_str("\"\"");
                i = (j + 1).min(b.len());
            }
            _ => {
                let c = ptx[i..].chars().next().expect("in bounds");
                out.push(c);
                i += c.len_utf8();
            }
        }
    }
    (out, asm_blocks)
}

/// Directives that end at the end of their line, without `;`.
const LINE_DIRECTIVES: &[&str] = &[
    ".version",
    ".target",
    ".address_size",
    ".file",
    ".loc",
    ".maxntid",
    ".reqntid",
    ".minnctapersm",
    ".maxnctapersm",
    ".maxnreg",
    ".noreturn",
    ".explicitcluster",
    ".reqnctapercluster",
    ".maxclusterrank",
    ".blocksareclusters",
];

fn line_directive(cur: &str) -> bool {
    cur.split_whitespace()
        .next()
        .is_some_and(|t| LINE_DIRECTIVES.contains(&t))
}

/// Split cleaned PTX into statements, tracking function bodies. A `{` at module scope after
/// `=` starts an initializer, not a body.
fn statements(clean: &str) -> (Vec<Stmt>, usize) {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut init = 0usize;
    let mut funcs = 0usize;
    let mut cur = String::new();
    let mut func: Option<usize> = None;
    let push = |cur: &mut String, func: Option<usize>, out: &mut Vec<Stmt>| {
        let t = cur.split_whitespace().collect::<Vec<_>>().join(" ");
        if !t.is_empty() {
            out.push(Stmt { text: t, func });
        }
        cur.clear();
    };
    for c in clean.chars() {
        match c {
            '{' if init > 0 || (depth == 0 && cur.contains('=')) => {
                init += 1;
                cur.push(c);
            }
            '}' if init > 0 => {
                init -= 1;
                cur.push(c);
            }
            '{' => {
                push(&mut cur, func, &mut out);
                if depth == 0 {
                    func = Some(funcs);
                    funcs += 1;
                }
                depth += 1;
            }
            '}' => {
                push(&mut cur, func, &mut out);
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    func = None;
                }
            }
            ';' => push(&mut cur, func, &mut out),
            '\n' if init == 0 && line_directive(&cur) => push(&mut cur, func, &mut out),
            _ => cur.push(c),
        }
    }
    push(&mut cur, func, &mut out);
    (out, funcs)
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '$'
}

/// Identifiers and registers of an operand text (`%rd1`, `counter`, `$str`), in order;
/// numbers, punctuation and `.x`-style suffixes are dropped.
fn names(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i] as char;
        let starts = c == '%' || c == '_' || c == '$' || c.is_ascii_alphabetic();
        // A `.` starts a suffix or a directive, a digit a number: skip them whole.
        if c == '.' || c.is_ascii_digit() {
            let mut j = i + 1;
            while j < b.len() && is_ident_char(b[j] as char) {
                j += 1;
            }
            i = j;
            continue;
        }
        if starts {
            let mut j = i + 1;
            while j < b.len() && is_ident_char(b[j] as char) {
                j += 1;
            }
            out.push(&s[i..j]);
            i = j;
        } else {
            i += 1;
        }
    }
    out
}

/// Split operands at top-level commas (not inside `[]`, `{}` or `()`).
fn operands(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '[' | '{' | '(' => depth += 1,
            ']' | '}' | ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(s[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    let last = s[start..].trim();
    if !last.is_empty() {
        out.push(last);
    }
    out
}

/// An instruction: opcode (`st.global.u32`) and its operand text.
struct Insn<'a> {
    opcode: &'a str,
    rest: &'a str,
}

fn instruction(text: &str) -> Option<Insn<'_>> {
    let mut t = text.trim();
    // Labels: `$L__BB0_1:` (not `::` of a state space).
    while let Some(i) = t.find(':') {
        let head = &t[..i];
        if t[i + 1..].starts_with(':') || head.is_empty() || !head.chars().all(is_ident_char) {
            break;
        }
        t = t[i + 1..].trim_start();
    }
    if let Some(p) = t.strip_prefix('@') {
        // The guard predicate: `@%p1` or `@!%p1`.
        let end = p.find(char::is_whitespace)?;
        t = p[end..].trim_start();
    }
    if t.is_empty() || t.starts_with('.') {
        return None; // a directive (.reg, .loc, .pragma, ...)
    }
    let end = t.find(char::is_whitespace).unwrap_or(t.len());
    Some(Insn {
        opcode: &t[..end],
        rest: t[end..].trim(),
    })
}

/// The registers a `.reg` directive declares: exact names, and `prefix<N>` ranges.
#[derive(Default)]
struct Regs {
    exact: HashSet<String>,
    ranges: HashMap<String, u64>,
}

impl Regs {
    fn declare(&mut self, text: &str) {
        for part in text.split(',') {
            let Some(at) = part.find('%') else { continue };
            let decl = part[at..].trim();
            match decl.split_once('<') {
                Some((prefix, n)) => {
                    let n = n.trim_end_matches('>').trim().parse().unwrap_or(u64::MAX);
                    let e = self.ranges.entry(prefix.trim().to_string()).or_default();
                    *e = (*e).max(n);
                }
                None => {
                    let name: String = decl
                        .chars()
                        .take_while(|&c| c == '%' || is_ident_char(c))
                        .collect();
                    self.exact.insert(name);
                }
            }
        }
    }

    fn declared(&self, name: &str) -> bool {
        if self.exact.contains(name) {
            return true;
        }
        let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 {
            return false;
        }
        let (prefix, n) = name.split_at(name.len() - digits);
        match (self.ranges.get(prefix), n.parse::<u64>()) {
            (Some(&max), Ok(n)) => n < max,
            _ => false,
        }
    }
}

fn opcode_parts(op: &str) -> Vec<&str> {
    op.split('.').collect()
}

fn on_shared(op: &str) -> bool {
    opcode_parts(op).iter().any(|p| p.starts_with("shared"))
}

/// Instructions that write memory at their first `[address]` operand.
fn writes_memory(op: &str) -> bool {
    let base = opcode_parts(op)[0];
    matches!(base, "st" | "red" | "atom")
        || op.starts_with("multimem.st")
        || op.starts_with("multimem.red")
        || (base == "cp"
            && (op.starts_with("cp.reduce.async.bulk.global")
                || op.starts_with("cp.async.bulk.global")
                || op.starts_with("cp.async.bulk.tensor") && op.contains(".global.")))
}

fn is_atomic(op: &str) -> bool {
    let base = opcode_parts(op)[0];
    base == "atom"
        || base == "red"
        || op.starts_with("cp.reduce.async.bulk")
        || op.starts_with("multimem.red")
}

/// Audit one module's PTX text (what `nvrtcGetPTX` returns).
pub fn audit_ptx(ptx: &str) -> Audit {
    let mut audit = Audit::default();
    let (clean, asm_blocks) = strip(ptx);
    if asm_blocks > 0 {
        audit.add(
            Capability::InlineAsm,
            format!("{asm_blocks} inline asm block(s)"),
        );
    }
    // PTX accepts C preprocessor directives (`#define`, token pasting), which NVRTC never
    // writes but inline assembly may: the audit does not expand them, so what they could hide
    // counts as found.
    if let Some(d) = clean.lines().map(str::trim).find(|l| l.starts_with('#')) {
        let what: String = d
            .split_whitespace()
            .next()
            .unwrap_or("#")
            .chars()
            .take(32)
            .collect();
        for c in Capability::GATED {
            audit.add(
                c,
                format!("a preprocessor directive ({what}) the audit does not expand"),
            );
        }
    }
    let (stmts, funcs) = statements(&clean);

    // Module scope: `.global` variables, and registers declared there.
    let mut globals: HashSet<String> = HashSet::new();
    let mut module_regs = Regs::default();
    for s in stmts.iter().filter(|s| s.func.is_none()) {
        let toks: Vec<&str> = s.text.split_whitespace().collect();
        if toks.first() == Some(&".reg") {
            module_regs.declare(&s.text);
            continue;
        }
        let is_var = toks.contains(&".global")
            && !toks.iter().any(|t| {
                t.starts_with(".entry") || t.starts_with(".func") || *t == ".callprototype"
            });
        if is_var {
            let decl = s.text.split('=').next().unwrap_or("");
            if let Some(n) = names(decl).into_iter().find(|n| !n.starts_with('%')) {
                globals.insert(n.to_string());
            }
        }
        if toks.contains(&".callprototype") {
            audit.add(Capability::IndirectCall, ".callprototype");
        }
    }

    for f in 0..funcs {
        let body: Vec<&Stmt> = stmts.iter().filter(|s| s.func == Some(f)).collect();
        let mut regs = Regs::default();
        for s in &body {
            if s.text.starts_with(".reg") {
                regs.declare(&s.text);
            }
            if s.text.contains(".callprototype") {
                audit.add(Capability::IndirectCall, ".callprototype");
            }
        }
        let insns: Vec<Insn> = body.iter().filter_map(|s| instruction(&s.text)).collect();
        audit_function(&insns, &regs, &module_regs, &globals, &mut audit);
    }
    audit
}

fn audit_function(
    insns: &[Insn],
    regs: &Regs,
    module_regs: &Regs,
    globals: &HashSet<String>,
    audit: &mut Audit,
) {
    for i in insns {
        let base = opcode_parts(i.opcode)[0];
        // Special registers among the operands.
        for n in names(i.rest) {
            if n.starts_with('%') && !regs.declared(n) && !module_regs.declared(n) {
                if let Some(c) = special_register(n) {
                    audit.add(c, n);
                }
            }
        }
        match base {
            "trap" | "brkpt" => audit.add(Capability::Trap, base),
            "call" => {
                let ops = operands(i.rest);
                // `call (ret), f, (args)`, `call f, (args)` or `call f`: the callee is the
                // first operand not in parentheses.
                if let Some(callee) = ops.iter().find(|o| !o.starts_with('(')) {
                    let callee = callee.trim();
                    if callee.starts_with('%') {
                        audit.add(Capability::IndirectCall, "call through a register");
                    } else {
                        match callee {
                            "vprintf" => audit.add(Capability::Printf, "vprintf"),
                            "__assertfail" | "__assert_fail" => {
                                audit.add(Capability::Printf, callee);
                                audit.add(Capability::Trap, callee);
                            }
                            c if HEAP.contains(&c) => audit.add(Capability::State, c),
                            c if launches_kernels(c) => {
                                audit.add(Capability::DynamicParallelism, c)
                            }
                            _ => {}
                        }
                    }
                }
            }
            _ => {}
        }
        if is_atomic(i.opcode) && !on_shared(i.opcode) {
            audit.add(Capability::GlobalAtomics, i.opcode);
        }
    }
    if globals.is_empty() {
        return;
    }
    // Module-scope variables: follow their addresses through registers (to a fixpoint, for
    // loops), each register to the variable it points into, and find a write through one, or
    // one leaving into memory or a call.
    let mut tainted: HashMap<&str, &str> = HashMap::new();
    let origin = |n: &str, t: &HashMap<&str, &str>| -> Option<String> {
        globals
            .get(n)
            .map(String::to_string)
            .or_else(|| t.get(n).map(|g| g.to_string()))
    };
    loop {
        let before = tainted.len();
        for i in insns {
            let base = opcode_parts(i.opcode)[0];
            if writes_memory(i.opcode) || base == "ld" || base == "call" || base == "ldu" {
                continue;
            }
            let ops = operands(i.rest);
            if ops.len() < 2 {
                continue;
            }
            let from = ops[1..].iter().flat_map(|o| names(o)).find_map(|n| {
                globals
                    .get(n)
                    .map(String::as_str)
                    .or(tainted.get(n).copied())
            });
            if let Some(g) = from {
                for d in names(ops[0]).into_iter().filter(|n| n.starts_with('%')) {
                    tainted.entry(d).or_insert(g);
                }
            }
        }
        if tainted.len() == before {
            break;
        }
    }
    // Param stores of a tainted value wait for their call: passing a string's address to
    // vprintf or __assertfail is no write.
    let mut pending: Vec<String> = Vec::new();
    for i in insns {
        let base = opcode_parts(i.opcode)[0];
        let ops = operands(i.rest);
        if base == "call" {
            let callee = ops.iter().find(|o| !o.starts_with('(')).map(|c| c.trim());
            // printf's and assert's arguments are strings they only read.
            if !matches!(callee, Some("vprintf" | "__assertfail" | "__assert_fail")) {
                for p in pending.drain(..) {
                    audit.add(Capability::State, p);
                }
            }
            pending.clear();
            // Registers passed directly.
            if let Some(g) = ops
                .iter()
                .flat_map(|o| names(o))
                .filter(|n| n.starts_with('%'))
                .find_map(|n| tainted.get(n))
            {
                audit.add(
                    Capability::State,
                    format!("address of {g} passed to a call"),
                );
            }
            continue;
        }
        if writes_memory(i.opcode) {
            // The written address is the first `[...]` operand (after `atom`'s destination);
            // the operands after it are the values written.
            let Some(at) = ops.iter().position(|o| o.starts_with('[')) else {
                continue;
            };
            if let Some(g) = names(ops[at]).into_iter().find_map(|n| origin(n, &tainted)) {
                audit.add(Capability::State, format!("{} to {g}", i.opcode));
            }
            // A value written that is an address of one: it leaves into memory.
            if let Some(g) = ops[at + 1..]
                .iter()
                .flat_map(|o| names(o))
                .find_map(|n| origin(n, &tainted))
            {
                let what = format!("address of {g} stored ({})", i.opcode);
                if i.opcode.starts_with("st.param") {
                    pending.push(what);
                } else {
                    audit.add(Capability::State, what);
                }
            }
        }
    }
    for p in pending {
        audit.add(Capability::State, p);
    }
}

#[cfg(test)]
mod tests;
