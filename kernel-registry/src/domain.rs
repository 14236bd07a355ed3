//! Newtypes for the words of docs/spec.md section 2, parsed once at the edge.

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::fmt;
use std::str::FromStr;

/// A value that is not one of the allowed words; the message names what is allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} `{got}` is not valid: {allowed}")]
pub struct ParseError {
    pub what: &'static str,
    pub got: String,
    pub allowed: String,
}

macro_rules! word_enum {
    ($(#[$m:meta])* $name:ident, $what:literal, { $($var:ident => $s:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub enum $name { $($var),+ }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$var),+];
            pub fn as_str(self) -> &'static str {
                match self { $($name::$var => $s),+ }
            }
        }
        impl FromStr for $name {
            type Err = ParseError;
            fn from_str(s: &str) -> Result<Self, ParseError> {
                match s { $($s => Ok($name::$var),)+
                    _ => Err(ParseError {
                        what: $what,
                        got: s.to_string(),
                        allowed: format!("one of {}", [$($s),+].join(", ")),
                    }),
                }
            }
        }
        impl TryFrom<String> for $name {
            type Error = ParseError;
            fn try_from(s: String) -> Result<Self, ParseError> { s.parse() }
        }
        impl From<$name> for String {
            fn from(v: $name) -> String { v.as_str().to_string() }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { f.write_str(self.as_str()) }
        }
    };
}

word_enum!(
    /// The operations of docs/spec.md section 2 (gelu and gelu_tanh counted as two entry names).
    Op, "op", {
        RmsNorm => "rms_norm",
        FusedAddRmsNorm => "fused_add_rms_norm",
        LayerNorm => "layer_norm",
        Silu => "silu",
        SiluAndMul => "silu_and_mul",
        Gelu => "gelu",
        GeluTanh => "gelu_tanh",
        SiluMul => "silu_mul",
        GeluTanhMul => "gelu_tanh_mul",
    }
);

word_enum!(
    /// Which eager function a kernel claims to reproduce.
    Semantics, "semantics", {
        Llama => "llama",
        Gemma => "gemma",
        Torch => "torch",
        Default => "default",
    }
);

word_enum!(
    /// Storage dtype T of docs/spec.md section 2.
    DType, "dtype", {
        Bf16 => "bf16",
        F16 => "f16",
        F32 => "f32",
    }
);

impl Op {
    /// The semantics variants this op has; the first is the default.
    pub fn semantics(self) -> &'static [Semantics] {
        match self {
            Op::RmsNorm => &[Semantics::Llama, Semantics::Gemma, Semantics::Torch],
            _ => &[Semantics::Default],
        }
    }
    pub fn default_semantics(self) -> Semantics {
        self.semantics()[0]
    }
    /// Row-wise ops take (rows, cols); elementwise ops take n.
    pub fn is_rowwise(self) -> bool {
        matches!(
            self,
            Op::RmsNorm
                | Op::FusedAddRmsNorm
                | Op::LayerNorm
                | Op::SiluAndMul
                | Op::SiluMul
                | Op::GeluTanhMul
        )
    }
    /// The gated ops of HF's MLPs: `act(gate) * up` on two `[rows, cols]` tensors.
    pub fn is_gated(self) -> bool {
        matches!(self, Op::SiluMul | Op::GeluTanhMul)
    }
    /// The kernel ABI of docs/spec.md section 2: the entry's parameters after its name, `T` standing
    /// for the dtype's C type ([`DType::cuda_type`]). The one description of the ABI: the
    /// verifier builds its launch arguments from these names (`gpu::abi_args`), and
    /// `python/tests/fixtures/abi.json` (checked by a test here) carries them to the generator
    /// of the bundled kernels and the Python client's launches.
    pub fn abi(self) -> &'static str {
        match self {
            Op::RmsNorm => {
                "T* out, const T* x, const T* w, long long rows, long long cols, float eps"
            }
            Op::FusedAddRmsNorm => {
                "T* out, T* residual, const T* x, const T* w, long long rows, long long cols, float eps"
            }
            Op::LayerNorm => {
                "T* out, const T* x, const T* w, const T* b, long long rows, long long cols, float eps"
            }
            Op::Silu | Op::Gelu | Op::GeluTanh => "T* out, const T* x, long long n",
            Op::SiluAndMul => "T* out, const T* x, long long rows, long long cols",
            Op::SiluMul | Op::GeluTanhMul => {
                "T* out, const T* gate, const T* up, long long rows, long long cols"
            }
        }
    }
    /// The parameter names of [`Op::abi`], in order.
    pub fn abi_names(self) -> Vec<&'static str> {
        self.abi()
            .split(',')
            .map(|p| p.trim().rsplit([' ', '*']).next().unwrap_or(""))
            .collect()
    }
    /// Ops whose ABI takes a scalar `eps` (the norms).
    pub fn takes_eps(self) -> bool {
        matches!(self, Op::RmsNorm | Op::FusedAddRmsNorm | Op::LayerNorm)
    }
    /// How many `rows x cols` tensors a launch writes and a verification compares:
    /// fused_add_rms_norm writes `out` and updates `residual`; every other op writes `out`.
    pub fn outputs(self) -> u64 {
        match self {
            Op::FusedAddRmsNorm => 2,
            _ => 1,
        }
    }
    /// The bytes one launch on `rows x cols` must move: every input read once and every output
    /// written once (weights and biases are one row). The speed of a case is this over its
    /// median time; the verifier and the hub's report checks use this one definition.
    pub fn bytes_moved(self, dt: DType, rows: u64, cols: u64) -> u64 {
        let e = dt.size_bytes() as u64;
        let n = rows.saturating_mul(cols);
        e.saturating_mul(match self {
            Op::RmsNorm => n.saturating_mul(2).saturating_add(cols),
            Op::FusedAddRmsNorm => n.saturating_mul(4).saturating_add(cols),
            Op::LayerNorm => n.saturating_mul(2).saturating_add(2 * cols),
            Op::Silu | Op::Gelu | Op::GeluTanh => n.saturating_mul(2),
            Op::SiluAndMul | Op::SiluMul | Op::GeluTanhMul => n.saturating_mul(3),
        })
    }
    /// Parse the semantics for this op, checking it is one this op has.
    pub fn check_semantics(self, s: Semantics) -> Result<Semantics, ParseError> {
        if self.semantics().contains(&s) {
            Ok(s)
        } else {
            Err(ParseError {
                what: "semantics",
                got: s.to_string(),
                allowed: format!(
                    "for op {self}: one of {}",
                    self.semantics()
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            })
        }
    }
}

impl DType {
    pub fn size_bytes(self) -> usize {
        match self {
            DType::Bf16 | DType::F16 => 2,
            DType::F32 => 4,
        }
    }
    /// The C type name of this dtype in CUDA source.
    pub fn cuda_type(self) -> &'static str {
        match self {
            DType::Bf16 => "__nv_bfloat16",
            DType::F16 => "__half",
            DType::F32 => "float",
        }
    }
}

/// A CUDA compute capability, `sm_<major><minor>` (e.g. `sm_90`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Arch {
    pub major: u32,
    pub minor: u32,
}

impl Arch {
    pub fn new(major: u32, minor: u32) -> Self {
        Arch { major, minor }
    }
}

impl FromStr for Arch {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        let err = || ParseError {
            what: "arch",
            got: s.to_string(),
            allowed: "sm_<major><minor> with a one-digit minor, e.g. sm_80, sm_89, sm_90, sm_100"
                .into(),
        };
        let digits = s.strip_prefix("sm_").ok_or_else(err)?;
        if digits.len() < 2 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err());
        }
        let (maj, min) = digits.split_at(digits.len() - 1);
        let major: u32 = maj.parse().map_err(|_| err())?;
        if !(3..=20).contains(&major) {
            return Err(err());
        }
        Ok(Arch {
            major,
            minor: min.parse().map_err(|_| err())?,
        })
    }
}
impl TryFrom<String> for Arch {
    type Error = ParseError;
    fn try_from(s: String) -> Result<Self, ParseError> {
        s.parse()
    }
}
impl From<Arch> for String {
    fn from(a: Arch) -> String {
        a.to_string()
    }
}
impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sm_{}{}", self.major, self.minor)
    }
}

/// A content digest: `sha256:` followed by 64 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Digest(String);

impl Digest {
    pub fn of_bytes(bytes: &[u8]) -> Digest {
        Digest(format!("sha256:{}", hex::encode(Sha256::digest(bytes))))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// The hex part alone, handy for file names and URLs.
    pub fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }
}

impl FromStr for Digest {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        // Accept the bare hex too: it is what a URL path naturally carries.
        let hex_part = s.strip_prefix("sha256:").unwrap_or(s);
        if hex_part.len() == 64
            && hex_part
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            Ok(Digest(format!("sha256:{hex_part}")))
        } else {
            Err(ParseError {
                what: "digest",
                got: s.to_string(),
                allowed: "sha256:<64 lowercase hex digits> (or the 64 hex digits alone)".into(),
            })
        }
    }
}
impl TryFrom<String> for Digest {
    type Error = ParseError;
    fn try_from(s: String) -> Result<Self, ParseError> {
        s.parse()
    }
}
impl From<Digest> for String {
    fn from(d: Digest) -> String {
        d.0
    }
}
impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip_and_reject_with_allowed_list() {
        for op in Op::ALL {
            assert_eq!(op.as_str().parse::<Op>().unwrap(), *op);
        }
        let e = "rmsnorm".parse::<Op>().unwrap_err();
        assert!(
            e.to_string().contains("rms_norm, fused_add_rms_norm"),
            "{e}"
        );
        assert!("bfloat16".parse::<DType>().is_err());
    }

    #[test]
    fn arch_parses_and_prints() {
        assert_eq!("sm_90".parse::<Arch>().unwrap(), Arch::new(9, 0));
        assert_eq!("sm_100".parse::<Arch>().unwrap(), Arch::new(10, 0));
        assert_eq!(Arch::new(8, 9).to_string(), "sm_89");
        for bad in ["90", "sm_9", "sm_x0", "sm_", "compute_90"] {
            assert!(bad.parse::<Arch>().is_err(), "{bad}");
        }
        assert!(Arch::new(8, 0) < Arch::new(9, 0));
    }

    #[test]
    fn digest_accepts_bare_hex_and_rejects_junk() {
        let d = Digest::of_bytes(b"abc");
        assert_eq!(d.hex().parse::<Digest>().unwrap(), d);
        assert!("sha256:XYZ".parse::<Digest>().is_err());
        assert!(d.as_str().to_uppercase().parse::<Digest>().is_err());
    }

    #[test]
    fn every_op_has_an_abi_with_out_first_and_its_sizes() {
        for op in Op::ALL {
            let names = op.abi_names();
            assert_eq!(names[0], "out", "{op}");
            if op.is_rowwise() {
                assert!(
                    names.ends_with(&["rows", "cols", "eps"]) || names.ends_with(&["rows", "cols"]),
                    "{op}: {names:?}"
                );
            } else {
                assert_eq!(names.last(), Some(&"n"), "{op}");
            }
            assert_eq!(names.contains(&"eps"), op.takes_eps(), "{op}");
            assert_eq!(
                names.contains(&"gate") && names.contains(&"up"),
                op.is_gated(),
                "{op}"
            );
        }
        assert_eq!(
            Op::SiluMul.abi_names(),
            ["out", "gate", "up", "rows", "cols"]
        );
        assert_eq!(Op::GeluTanhMul.abi(), Op::SiluMul.abi());
    }

    /// `python/tests/fixtures/abi.json`: the ABI table for the Python side (the generator of the
    /// bundled kernels, the client's launches and op lists), written from `Op` and checked here.
    #[test]
    fn abi_fixture_for_python_is_current() {
        let ops: serde_json::Map<String, serde_json::Value> = Op::ALL
            .iter()
            .map(|op| {
                (
                    op.to_string(),
                    serde_json::json!({
                        "abi": op.abi(),
                        "params": op.abi_names(),
                        "rowwise": op.is_rowwise(),
                        "gated": op.is_gated(),
                        "takes_eps": op.takes_eps(),
                        "semantics": op.semantics(),
                    }),
                )
            })
            .collect();
        let want = serde_json::to_string_pretty(&serde_json::json!({
            "comment": "Written by kernel-registry's test domain::tests::abi_fixture_for_python_is_current from Op (docs/spec.md section 2); do not edit: change Op and run KERNELIZE_UPDATE_FIXTURES=1 cargo test -p kernel-registry abi_fixture",
            "ops": ops,
        }))
        .unwrap()
            + "\n";
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../python/tests/fixtures/abi.json");
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        if have != want {
            if std::env::var("KERNELIZE_UPDATE_FIXTURES").as_deref() == Ok("1") {
                std::fs::write(&path, &want).unwrap();
            } else {
                panic!(
                    "{} is not what Op says: run `KERNELIZE_UPDATE_FIXTURES=1 cargo test -p kernel-registry abi_fixture` and commit it",
                    path.display()
                );
            }
        }
    }

    #[test]
    fn semantics_checked_per_op() {
        assert!(Op::RmsNorm.check_semantics(Semantics::Gemma).is_ok());
        let e = Op::Silu.check_semantics(Semantics::Llama).unwrap_err();
        assert!(e.to_string().contains("default"), "{e}");
    }
}
