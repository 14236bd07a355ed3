//! Batch invariance: every row of a case recomputed in other batch compositions and compared,
//! bit for bit, with the same row of the case's own launch. The compositions (`plan`): the rows
//! shuffled into one batch of the same size (other positions), split into consecutive batches of
//! sizes 1, 1, 1, 2, 3, 5, ... (alone and in small, decode-sized batches), and inside a larger
//! batch behind a few other rows. Compositions are gathered on the GPU from the case's inputs,
//! so a 32768-row case costs a few launches, not transfers.

use super::CaseRun;
use crate::cuda::{Arg, DevBuf};
use crate::exec::ExecError;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::Duration;

/// One composition: batches of source row indices, each launched on its own.
#[derive(Debug, Clone, PartialEq)]
pub struct Composition {
    pub name: &'static str,
    pub batches: Vec<Vec<u64>>,
}

/// At most this many launches for the split composition (its last batch takes the rest).
pub const MAX_SPLIT_BATCHES: usize = 40;

/// Batch sizes of the split composition, in order: rows alone first, then growing sizes that
/// cross eager's small-batch regimes (below 16 rows) and beyond.
const SPLIT_SIZES: [u64; 16] = [1, 1, 1, 2, 3, 5, 8, 13, 15, 16, 17, 31, 64, 129, 333, 1024];

/// The compositions every row of a `rows`-row case is recomputed in (deterministic in `seed`).
/// Every row appears in every composition.
pub fn plan(rows: u64, seed: u64) -> Vec<Composition> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut order: Vec<u64> = (0..rows).collect();
    order.shuffle(&mut rng);
    let mut out = Vec::new();
    if rows > 1 {
        out.push(Composition {
            name: "shuffled",
            batches: vec![order.clone()],
        });
        let mut batches: Vec<Vec<u64>> = Vec::new();
        let mut at = 0usize;
        let mut k = 0usize;
        while at < order.len() {
            let size = if batches.len() + 1 == MAX_SPLIT_BATCHES {
                order.len() - at
            } else {
                let base = SPLIT_SIZES[k % SPLIT_SIZES.len()] as usize;
                // Past the table, keep growing so that big cases stay within the launch budget.
                base << (k / SPLIT_SIZES.len())
            };
            let end = (at + size).min(order.len());
            batches.push(order[at..end].to_vec());
            at = end;
            k += 1;
        }
        out.push(Composition {
            name: "split",
            batches,
        });
    }
    // Behind 1..=67 other rows (drawn from the case), so every row sits at a new position of a
    // larger batch.
    let lead = rng.gen_range(1..=67u64);
    let mut grown: Vec<u64> = (0..lead).map(|_| rng.gen_range(0..rows)).collect();
    grown.extend(0..rows);
    out.push(Composition {
        name: "inside a larger batch",
        batches: vec![grown],
    });
    out
}

/// Run every composition of the case on the GPU against `base` (the device copy of the case's
/// launch-1 output, and of its residual for fused_add_rms_norm). `None` when every row matched,
/// else a note saying which rows differed and where.
pub(crate) fn check(
    run: &CaseRun<'_>,
    base: &DevBuf,
    base_res: Option<&DevBuf>,
) -> Result<Option<String>, ExecError> {
    let (gpu, spec) = (run.gpu, run.spec);
    let es = spec.dtype.size_bytes() as u64;
    let in_row = run.x_row_len() * es;
    let out_row = spec.cols * es;
    let mut notes = Vec::new();
    let res = gpu.alloc(16)?;
    for comp in plan(spec.rows, spec.seed ^ 0xBA7C) {
        let mut differ_rows = 0u64;
        let mut example = None;
        for batch in &comp.batches {
            let n = batch.len() as u64;
            let idx = gpu.alloc(batch.len() * 8)?;
            let idx_bytes: Vec<u8> = batch
                .iter()
                .flat_map(|r| (*r as i64).to_le_bytes())
                .collect();
            gpu.upload(&idx, &idx_bytes)?;
            let x = gpu.alloc((n * in_row) as usize)?;
            run.gather(&x, &run.bufs.x, &idx, n, in_row)?;
            let residual = match &run.bufs.residual {
                Some(r) => {
                    let d = gpu.alloc((n * out_row) as usize)?;
                    run.gather(&d, r, &idx, n, out_row)?;
                    Some(d)
                }
                None => None,
            };
            let out = gpu.alloc((n * out_row) as usize)?;
            run.poison_and_launch_candidate(&out, residual.as_ref(), Some(&x), n)?;
            let mut pairs = vec![(&out, base)];
            if let (Some(r), Some(b)) = (&residual, base_res) {
                pairs.push((r, b));
            }
            for (got, want) in pairs {
                let mut init = [0u8; 16];
                init[8..].copy_from_slice(&u64::MAX.to_le_bytes());
                gpu.upload(&res, &init)?;
                gpu.launch(
                    "row comparison on the GPU",
                    run.tools.rows_differ,
                    [(n as u32).clamp(1, 4096), 1, 1],
                    [256, 1, 1],
                    0,
                    &[
                        Arg::Ptr(got.ptr()),
                        Arg::Ptr(want.ptr()),
                        Arg::Ptr(idx.ptr()),
                        Arg::I64(n as i64),
                        Arg::I64(out_row as i64),
                        Arg::Ptr(res.ptr()),
                    ],
                    Duration::from_secs(60),
                )?;
                let mut r = [0u8; 16];
                gpu.download(&res, &mut r)?;
                let count = u64::from_le_bytes(r[..8].try_into().expect("8 bytes"));
                let at = u64::from_le_bytes(r[8..].try_into().expect("8 bytes"));
                if count > 0 {
                    differ_rows += count;
                    example.get_or_insert((batch[at as usize], at, n));
                }
            }
        }
        if let Some((row, pos, n)) = example {
            notes.push(format!(
                "{differ_rows} row(s) differ when recomputed {} (e.g. row {row} at position {pos} of a batch of {n} rows)",
                comp.name
            ));
        }
    }
    Ok((!notes.is_empty()).then(|| notes.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn every_row_is_in_every_composition() {
        for rows in [1u64, 2, 5, 16, 64, 333, 4096, 32768] {
            let plan = plan(rows, 7);
            assert_eq!(plan.len(), if rows > 1 { 3 } else { 1 });
            for c in &plan {
                let seen: BTreeSet<u64> = c.batches.iter().flatten().copied().collect();
                assert_eq!(seen.len() as u64, rows, "{rows} rows, {}", c.name);
                assert!(c.batches.iter().flatten().all(|&r| r < rows));
            }
        }
    }

    #[test]
    fn compositions_change_batch_sizes_and_positions() {
        let plan = plan(4096, 3);
        let split = plan.iter().find(|c| c.name == "split").unwrap();
        assert!(split.batches.len() <= MAX_SPLIT_BATCHES);
        let sizes: BTreeSet<usize> = split.batches.iter().map(Vec::len).collect();
        for s in [1, 2, 3, 5, 8, 13, 15, 16, 17] {
            assert!(sizes.contains(&s), "batch of {s}: {sizes:?}");
        }
        let shuffled = &plan.iter().find(|c| c.name == "shuffled").unwrap().batches[0];
        let moved = shuffled
            .iter()
            .enumerate()
            .filter(|(i, &r)| *i as u64 != r)
            .count();
        assert!(moved > 4000, "rows move to other positions");
        let grown = &plan
            .iter()
            .find(|c| c.name == "inside a larger batch")
            .unwrap()
            .batches[0];
        assert!(grown.len() > 4096);
        // Deterministic in the seed.
        assert_eq!(plan, super::plan(4096, 3));
    }

    #[test]
    fn a_single_row_is_recomputed_inside_a_larger_batch() {
        let p = plan(1, 9);
        assert!(p[0].batches[0].len() >= 2);
        assert_eq!(*p[0].batches[0].last().unwrap(), 0);
    }
}
