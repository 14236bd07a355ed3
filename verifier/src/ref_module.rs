//! The reference layers of one op as a module of their own (issue 29). `reference.cu` holds every
//! op's reference entries (in its `REFS` macro) and the verifier's utilities; compiled whole it
//! had become the slowest module of most verifications (1002 KiB of CUBIN, about 7 s of NVRTC on
//! the CPU of docs/verifier.md's table, against 1-7 s for the elementwise kernels' and the rms
//! norms' modules). A verification launches only its op's entries, so it compiles `reference.cu`
//! without the other ops' entries: the same text otherwise, so every entry it keeps, and every
//! utility, compiles to the same SASS as in the whole module (checked with nvdisasm for silu,
//! layer_norm and rms_norm llama, NVRTC 13.0.88, sm_90: docs/verifier.md).

use crate::abi::{reference_prefix, REFERENCE_SOURCE};
use kernel_registry::{Op, Semantics};

/// The reference layers' source for (op, semantics): `reference.cu` without the reference
/// entries of other ops and semantics.
pub fn source(op: Op, sem: Semantics) -> String {
    keep_entries(REFERENCE_SOURCE, &reference_prefix(op, sem))
}

/// The module's key (with its source's hash, like `abi::reference_digest`).
pub fn digest(op: Op, sem: Semantics, source: &str) -> String {
    format!(
        "builtin-reference-{op}-{sem}-{}",
        crate::cases::stable_hash(source)
    )
}

/// The reference layers' module of (op, semantics): its key ([`digest`]) and source ([`source`]),
/// made once per process (every case of a verification asks for it; the source is filtered from
/// reference.cu's 1 MB and hashed).
pub fn module(op: Op, sem: Semantics) -> (&'static str, &'static str) {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    type Made = HashMap<(Op, Semantics), (&'static str, &'static str)>;
    static MADE: OnceLock<Mutex<Made>> = OnceLock::new();
    let mut made = MADE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    *made.entry((op, sem)).or_insert_with(|| {
        // (leaked once per op and semantics: a few dozen modules at most per process)
        let src: &'static str = Box::leak(source(op, sem).into_boxed_str());
        (Box::leak(digest(op, sem, src).into_boxed_str()), src)
    })
}

/// The name of a reference entry defined on `line` (`extern "C" __global__ void
/// [__launch_bounds__(..)] ref_<name>_##S(`), if one is.
fn entry_on(line: &str) -> Option<&str> {
    let rest = line.strip_prefix("extern \"C\" __global__ void ")?;
    let rest = match rest.strip_prefix("__launch_bounds__(") {
        Some(r) => r.split_once(") ")?.1,
        None => rest,
    };
    let name = rest.split_once("##S(")?.0;
    name.starts_with("ref_").then_some(name)
}

/// `src` without the reference entries whose name does not start with `prefix`; an entry spans
/// from its line to the line that closes its braces.
pub(crate) fn keep_entries(src: &str, prefix: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut depth: i64 = 0; // > 0 while inside an entry being left out
    for line in src.split_inclusive('\n') {
        let braces = |l: &str| l.matches('{').count() as i64 - l.matches('}').count() as i64;
        if depth > 0 {
            depth += braces(line);
            continue;
        }
        if let Some(name) = entry_on(line) {
            if !name.starts_with(prefix) {
                depth = braces(line);
                continue;
            }
        }
        out.push_str(line);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::{reference_stage_symbol, reference_symbol};
    use kernel_registry::DType;

    /// Every reference entry the verifier launches for (op, sem).
    fn launched(op: Op, sem: Semantics) -> Vec<String> {
        let mut v = Vec::new();
        for &dt in DType::ALL {
            if op.is_backward() {
                for st in op.stages() {
                    v.push(reference_stage_symbol(op, sem, st, dt));
                }
            } else {
                v.push(reference_symbol(op, sem, dt));
            }
        }
        v
    }

    fn entries(src: &str) -> Vec<String> {
        src.lines()
            .filter_map(entry_on)
            .map(str::to_string)
            .collect()
    }

    /// `module` is `digest` and `source`, made once: a second call hands back the same text.
    #[test]
    fn the_module_is_made_once_per_op() {
        let (d, s) = module(Op::LayerNorm, Semantics::Default);
        assert_eq!(s, source(Op::LayerNorm, Semantics::Default));
        assert_eq!(d, digest(Op::LayerNorm, Semantics::Default, s));
        let (d2, s2) = module(Op::LayerNorm, Semantics::Default);
        assert!(std::ptr::eq(s, s2) && std::ptr::eq(d, d2));
        assert_ne!(module(Op::Silu, Semantics::Default).0, d);
    }

    #[test]
    fn every_op_keeps_its_own_entries_the_utilities_and_nothing_else() {
        let all = entries(REFERENCE_SOURCE);
        assert!(all.len() >= 20, "{all:?}");
        for &op in Op::ALL {
            for &sem in op.semantics() {
                let src = source(op, sem);
                let kept = entries(&src);
                let prefix = reference_prefix(op, sem);
                // Kept: exactly the whole module's entries of this op and semantics.
                let want: Vec<_> = all.iter().filter(|e| e.starts_with(&prefix)).collect();
                assert_eq!(kept.iter().collect::<Vec<_>>(), want, "{op}/{sem}");
                for sym in launched(op, sem) {
                    let def = sym
                        .strip_suffix(&format!("_{}", sym.rsplit('_').next().unwrap_or("")))
                        .map(|base| format!("{base}_##S("))
                        .unwrap_or_default();
                    assert!(
                        src.contains(&def),
                        "{op}/{sem}: {sym} ({def}) is not in its module"
                    );
                }
                // The verifier's utilities and the REFS expansions are all there.
                for t in [
                    "kz_keyed_sum_u32(",
                    "kz_fill_pattern(",
                    "kz_gather_rows(",
                    "kz_rows_differ(",
                    "kz_gen_##S(",
                    "kz_mismatch_##S(",
                    "REFS(__nv_bfloat16, bf16)",
                    "REFS(float, f32)",
                ] {
                    assert!(src.contains(t), "{op}/{sem}: {t}");
                }
                // Whole lines left out: the braces still pair up, and what is kept is the
                // whole module's text in order.
                let b = |s: &str| s.matches('{').count() as i64 - s.matches('}').count() as i64;
                assert_eq!(b(&src), b(REFERENCE_SOURCE), "{op}/{sem}");
                let mut rest = REFERENCE_SOURCE;
                for line in src.split_inclusive('\n') {
                    let at = rest
                        .find(line)
                        .expect("a line of the whole source, in order");
                    rest = &rest[at + line.len()..];
                }
            }
        }
    }

    #[test]
    fn a_multi_line_entry_is_left_out_whole() {
        let src = "#define REFS(T, S) \\\n\
extern \"C\" __global__ void __launch_bounds__(RB) ref_a_x_##S(T* o) { f(o); } \\\n\
extern \"C\" __global__ void ref_b_x_##S(T* o) { \\\n    g(o); { h(o); } \\\n    k(o); } \\\n\
extern \"C\" __global__ void ref_c_x_##S(T* o) { f(o); }\n\nREFS(float, f32)\n";
        let a = keep_entries(src, "ref_a_");
        assert_eq!(
            a,
            "#define REFS(T, S) \\\nextern \"C\" __global__ void __launch_bounds__(RB) ref_a_x_##S(T* o) { f(o); } \\\n\nREFS(float, f32)\n"
        );
        let b = keep_entries(src, "ref_b_");
        assert!(b.contains("g(o); { h(o); }") && b.contains("k(o); } \\\n"));
        assert!(!b.contains("ref_a_") && !b.contains("ref_c_"));
        assert_eq!(keep_entries(src, "ref_"), src);
    }

    #[test]
    fn each_op_has_a_module_of_its_own() {
        let (a, b) = (
            source(Op::Silu, Semantics::Default),
            source(Op::LayerNorm, Semantics::Default),
        );
        assert_ne!(
            digest(Op::Silu, Semantics::Default, &a),
            digest(Op::LayerNorm, Semantics::Default, &b)
        );
        assert!(a.len() < REFERENCE_SOURCE.len() && b.len() < REFERENCE_SOURCE.len());
    }
}
