//! The host's share of a verification, without a GPU: for each case of a backward op's full
//! suite (or the cases named), the seconds `cases::generate` and `measure::gradients::verdict`
//! (exactness of one call against the reference, accuracy against the f64 oracle) take, the
//! reference's gradients standing in for the candidate's (the oracle rounded to the dtype: the
//! same amount of work). What `KERNELIZE_TRACE`'s `generate` and `exactness+oracle (host)`
//! phases measure on the GPU machine, here on any machine:
//!
//!     cargo run --release -p verifier --example host_phases -- rms_norm_backward [llama] [--top 10]
use kernel_registry::{DType, Op, Semantics};
use std::time::Instant;
use verifier::{cases, measure::gradients, oracle};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let op: Op = args
        .first()
        .expect("usage: host_phases OP [SEMANTICS] [--top N]")
        .parse()
        .expect("an op name (rms_norm_backward, layer_norm_backward, silu_backward, ...)");
    let sem: Semantics = args
        .get(1)
        .filter(|a| !a.starts_with("--"))
        .map(|s| s.parse().expect("a semantics"))
        .unwrap_or(op.default_semantics());
    let top: usize = args
        .iter()
        .position(|a| a == "--top")
        .and_then(|i| args.get(i + 1))
        .map_or(8, |n| n.parse().expect("--top N"));
    let suite = cases::suite(op, sem, DType::ALL, false, 1, &[]);
    let (mut gen_s, mut verdict_s, mut truth_s) = (0.0, 0.0, 0.0);
    let mut per: Vec<(f64, f64, String)> = Vec::new();
    for spec in suite.iter().filter(|s| !s.large_index) {
        let t = Instant::now();
        let inp = cases::generate(spec);
        let g = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let truth = oracle::rounded_backward_truth(spec, &inp);
        truth_s += t.elapsed().as_secs_f64();
        let refs: Vec<&[u8]> = truth.iter().map(Vec::as_slice).collect();
        let t = Instant::now();
        let v = gradients::verdict(spec, &inp, std::slice::from_ref(&refs), &refs, true, None);
        let d = t.elapsed().as_secs_f64();
        assert_eq!(v.exactness.mismatches, 0);
        gen_s += g;
        verdict_s += d;
        per.push((g, d, spec.id.clone()));
    }
    println!(
        "{op} {sem}: {} cases; generate {gen_s:.3} s, verdict {verdict_s:.3} s (the stand-in gradients {truth_s:.3} s, not a phase)",
        per.len()
    );
    per.sort_by(|a, b| (b.0 + b.1).total_cmp(&(a.0 + a.1)));
    for (g, d, id) in per.iter().take(top) {
        println!("  {id:40} generate {g:.3} s, verdict {d:.3} s");
    }
}
