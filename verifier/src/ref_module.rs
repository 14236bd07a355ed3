//! The reference layers of one op, for one dtype, as a module of their own (issue 29).
//! `reference.cu` holds every op's reference entries (in its `REFS` macro, instantiated once per
//! dtype) and the verifier's utilities; compiled whole it had become the slowest module of most
//! verifications (1002 KiB of CUBIN, about 7 s of NVRTC on the CPU of docs/verifier.md's table,
//! against 1-7 s for the elementwise kernels' and the rms norms' modules). A case launches only
//! its op's entries of its own dtype, so it compiles `reference.cu` without the other ops'
//! entries and without the other dtypes' `REFS` and `KZ_TOOLS` instantiations: the same text
//! otherwise, so every entry it keeps, and every utility, compiles to the same SASS as in the
//! whole module (checked with nvdisasm for silu, layer_norm and rms_norm llama, NVRTC 13.0.88,
//! sm_90: docs/verifier.md). One dtype's module takes 40-60% of the NVRTC time of the op's three
//! (docs/verifier.md, session 37), and a case waits only for its own.

use crate::abi::{reference_prefix, REFERENCE_SOURCE};
use kernel_registry::{DType, Op, Semantics};

/// The reference layers' source for (op, semantics, dtype): `reference.cu` without the
/// reference entries of other ops and semantics, and without the instantiations
/// (`REFS(T, S)`, `KZ_TOOLS(T, U, S)`) of other dtypes.
pub fn source(op: Op, sem: Semantics, dt: DType) -> String {
    keep_dtype(
        &keep_entries(REFERENCE_SOURCE, &reference_prefix(op, sem)),
        dt,
    )
}

/// The module's key (with its source's hash, like `abi::reference_digest`).
pub fn digest(op: Op, sem: Semantics, dt: DType, source: &str) -> String {
    format!(
        "builtin-reference-{op}-{sem}-{dt}-{}",
        crate::cases::stable_hash(source)
    )
}

/// The reference layers' module of (op, semantics, dtype): its key ([`digest`]) and source
/// ([`source`]), made once per process (every case of a verification asks for it; the source
/// is filtered from reference.cu's 1 MB and hashed).
pub fn module(op: Op, sem: Semantics, dt: DType) -> (&'static str, &'static str) {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    type Made = HashMap<(Op, Semantics, DType), (&'static str, &'static str)>;
    static MADE: OnceLock<Mutex<Made>> = OnceLock::new();
    let mut made = MADE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    *made.entry((op, sem, dt)).or_insert_with(|| {
        // (leaked once per op, semantics and dtype: a few dozen modules at most per process)
        let src: &'static str = Box::leak(source(op, sem, dt).into_boxed_str());
        (Box::leak(digest(op, sem, dt, src).into_boxed_str()), src)
    })
}

/// `src` without the lines that instantiate `REFS` or `KZ_TOOLS` for a dtype other than `dt`
/// (an instantiation is one line, `NAME(..., <dtype>)`, its last argument the dtype's name).
pub(crate) fn keep_dtype(src: &str, dt: DType) -> String {
    let own = format!(", {dt})");
    src.split_inclusive('\n')
        .filter(|line| {
            let l = line.trim_end();
            let instantiation =
                (l.starts_with("REFS(") || l.starts_with("KZ_TOOLS(")) && l.ends_with(')');
            !instantiation || l.ends_with(&own)
        })
        .collect()
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

    /// Every reference entry the verifier launches for (op, sem) in `dt`.
    fn launched(op: Op, sem: Semantics, dt: DType) -> Vec<String> {
        if op.is_backward() {
            op.stages()
                .iter()
                .map(|st| reference_stage_symbol(op, sem, st, dt))
                .collect()
        } else {
            vec![reference_symbol(op, sem, dt)]
        }
    }

    fn entries(src: &str) -> Vec<String> {
        src.lines()
            .filter_map(entry_on)
            .map(str::to_string)
            .collect()
    }

    /// `module` is `digest` and `source`, made once: a second call hands back the same text.
    #[test]
    fn the_module_is_made_once_per_op_and_dtype() {
        let (ln, def, bf) = (Op::LayerNorm, Semantics::Default, DType::Bf16);
        let (d, s) = module(ln, def, bf);
        assert_eq!(s, source(ln, def, bf));
        assert_eq!(d, digest(ln, def, bf, s));
        let (d2, s2) = module(ln, def, bf);
        assert!(std::ptr::eq(s, s2) && std::ptr::eq(d, d2));
        assert_ne!(module(Op::Silu, def, bf).0, d);
        assert_ne!(module(ln, def, DType::F32).0, d);
    }

    #[test]
    fn every_op_keeps_its_own_entries_the_utilities_and_nothing_else() {
        let all = entries(REFERENCE_SOURCE);
        assert!(all.len() >= 20, "{all:?}");
        let instantiations = [
            (
                DType::Bf16,
                "REFS(__nv_bfloat16, bf16)",
                "KZ_TOOLS(__nv_bfloat16, unsigned short, bf16)",
            ),
            (
                DType::F16,
                "REFS(__half, f16)",
                "KZ_TOOLS(__half, unsigned short, f16)",
            ),
            (
                DType::F32,
                "REFS(float, f32)",
                "KZ_TOOLS(float, unsigned int, f32)",
            ),
        ];
        for (_, r, t) in instantiations {
            assert!(
                REFERENCE_SOURCE.contains(r) && REFERENCE_SOURCE.contains(t),
                "{r} {t}"
            );
        }
        for &op in Op::ALL {
            for &sem in op.semantics() {
                for &dt in DType::ALL {
                    let src = source(op, sem, dt);
                    let kept = entries(&src);
                    let prefix = reference_prefix(op, sem);
                    // Kept: exactly the whole module's entries of this op and semantics.
                    let want: Vec<_> = all.iter().filter(|e| e.starts_with(&prefix)).collect();
                    assert_eq!(kept.iter().collect::<Vec<_>>(), want, "{op}/{sem}");
                    for sym in launched(op, sem, dt) {
                        let def = sym
                            .strip_suffix(&format!("_{}", sym.rsplit('_').next().unwrap_or("")))
                            .map(|base| format!("{base}_##S("))
                            .unwrap_or_default();
                        assert!(
                            src.contains(&def),
                            "{op}/{sem}: {sym} ({def}) is not in its module"
                        );
                    }
                    // The verifier's utilities, and this dtype's instantiations alone.
                    for t in [
                        "kz_keyed_sum_u32(",
                        "kz_keyed_sums(",
                        "kz_fill_pattern(",
                        "kz_place(",
                        "kz_gather_rows(",
                        "kz_rows_differ(",
                        "kz_gen_##S(",
                        "kz_mismatch_##S(",
                    ] {
                        assert!(src.contains(t), "{op}/{sem}/{dt}: {t}");
                    }
                    for (d, r, t) in instantiations {
                        let line = |x: &str| src.lines().any(|l| l == x);
                        assert_eq!(line(r), d == dt, "{op}/{sem}/{dt}: {r}");
                        assert_eq!(line(t), d == dt, "{op}/{sem}/{dt}: {t}");
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
    fn each_op_and_dtype_has_a_module_of_its_own() {
        let def = Semantics::Default;
        let (a, b) = (
            source(Op::Silu, def, DType::Bf16),
            source(Op::LayerNorm, def, DType::Bf16),
        );
        assert_ne!(
            digest(Op::Silu, def, DType::Bf16, &a),
            digest(Op::LayerNorm, def, DType::Bf16, &b)
        );
        assert!(a.len() < REFERENCE_SOURCE.len() && b.len() < REFERENCE_SOURCE.len());
        let c = source(Op::LayerNorm, def, DType::F16);
        assert_ne!(b, c);
        assert_ne!(
            digest(Op::LayerNorm, def, DType::Bf16, &b),
            digest(Op::LayerNorm, def, DType::F16, &c)
        );
    }
}
