//! Batch invariance: every row of a case recomputed in other batch compositions and compared,
//! bit for bit, with the same row of the case's own launch. The compositions (`plan`): the rows
//! shuffled into one batch of the same size (other positions), split into consecutive batches of
//! sizes 1, 1, 1, 2, 3, 5, ... (alone and in small, decode-sized batches), and inside a larger
//! batch behind a few other rows. Compositions are gathered on the GPU from the case's inputs,
//! so a 32768-row case costs a few launches, not transfers.

use super::poison::Poison;
use super::CaseRun;
use crate::abi::Ptrs;
use crate::cuda::{Arg, DevBuf, Gpu};
use crate::exec::ExecError;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

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

/// Where each batch of a composition lives inside one allocation: byte offsets of its rows,
/// each batch starting on a 256-byte boundary (the ABI promises 16-byte aligned tensors).
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    /// Offset of each batch, in bytes.
    pub offsets: Vec<u64>,
    pub total: u64,
}

pub fn layout(batches: &[Vec<u64>], row_bytes: u64) -> Layout {
    let mut offsets = Vec::with_capacity(batches.len());
    let mut at = 0u64;
    for b in batches {
        offsets.push(at);
        at = (at + b.len() as u64 * row_bytes).next_multiple_of(256);
    }
    Layout {
        offsets,
        total: at.max(256),
    }
}

/// The composition's row indices, every batch's in order, as i64 on the device (what the
/// gather and scatter of a batched launch read).
pub(crate) fn upload_rows(gpu: &Gpu, batches: &[Vec<u64>]) -> Result<DevBuf, ExecError> {
    let all_idx: Vec<u8> = batches
        .iter()
        .flatten()
        .flat_map(|r| (*r as i64).to_le_bytes())
        .collect();
    let idx = gpu.alloc(all_idx.len())?;
    gpu.upload(&idx, &all_idx)?;
    Ok(idx)
}

/// Run every composition of the case on the GPU against `base` (the case's launch-1 output,
/// and its residual for fused_add_rms_norm, on the device). A composition is laid out in one
/// allocation per tensor: its inputs (x, a gated op's up, fused_add's residual) gathered there, its output poisoned once, the candidate
/// launched on each batch's slice, and every row compared on the GPU; one download of the
/// per-batch counts. `None` when every row matched, else a note saying which rows differed
/// and where.
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
    for comp in plan(spec.rows, spec.seed ^ 0xBA7C) {
        let k = comp.batches.len();
        let (lin, lout) = (
            layout(&comp.batches, in_row),
            layout(&comp.batches, out_row),
        );
        let idx = upload_rows(gpu, &comp.batches)?;
        let x = gpu.alloc(lin.total as usize)?;
        let residual = match &run.bufs.residual {
            Some(_) => Some(gpu.alloc(lout.total as usize)?),
            None => None,
        };
        // A gated op's second input: rows of `cols` elements, laid out like the output.
        let up = match &run.bufs.up {
            Some(_) => Some(gpu.alloc(lout.total as usize)?),
            None => None,
        };
        let out = gpu.alloc(lout.total as usize)?;
        // Per batch: (mismatching rows, first such position) for the output and the residual.
        let slots = if residual.is_some() { 2 } else { 1 };
        let res = result_slots(run, k * slots)?;
        let p = Poison::fresh();
        gpu.fill_pattern(run.tools.fill, &out, p.key, p.invert)?;
        let mut idx_at = 0u64;
        for (i, batch) in comp.batches.iter().enumerate() {
            let n = batch.len() as u64;
            let idx_ptr = idx.ptr() + 8 * idx_at;
            run.gather(x.ptr() + lin.offsets[i], &run.bufs.x, idx_ptr, n, in_row)?;
            for (d, src) in [(&residual, &run.bufs.residual), (&up, &run.bufs.up)] {
                if let (Some(d), Some(src)) = (d, src) {
                    run.gather(d.ptr() + lout.offsets[i], src, idx_ptr, n, out_row)?;
                }
            }
            let t = Ptrs {
                out: out.ptr() + lout.offsets[i],
                residual: residual.as_ref().map(|d| d.ptr() + lout.offsets[i]),
                x: x.ptr() + lin.offsets[i],
                up: up.as_ref().map(|d| d.ptr() + lout.offsets[i]),
                ..run.bufs.ptrs(&out, None)
            };
            run.launch_at(&run.cand, t, n)?;
            let mut pairs = vec![(t.out, base.ptr())];
            if let (Some(r), Some(b)) = (t.residual, base_res) {
                pairs.push((r, b.ptr()));
            }
            for (slot, (got, want)) in pairs.into_iter().enumerate() {
                let at = res.ptr() + 16 * (i * slots + slot) as u64;
                enqueue_rows_differ(run, got, want, idx_ptr, n, out_row, at)?;
            }
            idx_at += n;
        }
        let got = gpu.download_vec(&res)?;
        notes.extend(composition_note(&comp, &got, slots));
    }
    Ok((!notes.is_empty()).then(|| notes.join("; ")))
}

/// `n` result slots on the device for `enqueue_rows_differ`, each (mismatching rows 0, first
/// such position `u64::MAX`).
pub(crate) fn result_slots(run: &CaseRun<'_>, n: usize) -> Result<DevBuf, ExecError> {
    let res = run.gpu.alloc(16 * n)?;
    let mut init = Vec::with_capacity(16 * n);
    for _ in 0..n {
        init.extend_from_slice(&0u64.to_le_bytes());
        init.extend_from_slice(&u64::MAX.to_le_bytes());
    }
    run.gpu.upload(&res, &init)?;
    Ok(res)
}

/// Queue the comparison on the GPU of `n` rows of `row_bytes` at `got` with rows `idx[0..n]`
/// of `base` (`idx` a device array of i64 row indices): the count of rows that differ and the
/// first such position are added into the result slot at `slot` (no wait).
pub(crate) fn enqueue_rows_differ(
    run: &CaseRun<'_>,
    got: u64,
    base: u64,
    idx: u64,
    n: u64,
    row_bytes: u64,
    slot: u64,
) -> Result<(), ExecError> {
    run.gpu.enqueue(
        "row comparison on the GPU",
        run.tools.rows_differ,
        [(n as u32).clamp(1, 4096), 1, 1],
        [256, 1, 1],
        &[
            Arg::Ptr(got),
            Arg::Ptr(base),
            Arg::Ptr(idx),
            Arg::I64(n as i64),
            Arg::I64(row_bytes as i64),
            Arg::Ptr(slot),
        ],
    )
}

/// The note of one composition from its result slots as downloaded (`slots` per batch, in
/// batch order): `None` when every row matched.
pub(crate) fn composition_note(comp: &Composition, got: &[u8], slots: usize) -> Option<String> {
    let word = |j: usize| u64::from_le_bytes(got[8 * j..8 * j + 8].try_into().expect("8"));
    let mut differ_rows = 0u64;
    let mut example = None;
    for (i, batch) in comp.batches.iter().enumerate() {
        for slot in 0..slots {
            let (count, at) = (
                word(2 * (i * slots + slot)),
                word(2 * (i * slots + slot) + 1),
            );
            if count > 0 {
                differ_rows += count;
                example.get_or_insert((batch[at as usize], at, batch.len()));
            }
        }
    }
    example.map(|(row, pos, n)| {
        format!(
            "{differ_rows} row(s) differ when recomputed {} (e.g. row {row} at position {pos} of a batch of {n} rows)",
            comp.name
        )
    })
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
    fn every_batch_starts_aligned_and_none_overlap() {
        let plan = plan(333, 1);
        for c in &plan {
            for row_bytes in [2u64, 254, 2002, 8192] {
                let l = layout(&c.batches, row_bytes);
                for (i, b) in c.batches.iter().enumerate() {
                    assert_eq!(l.offsets[i] % 256, 0);
                    let end = l.offsets[i] + b.len() as u64 * row_bytes;
                    let next = l.offsets.get(i + 1).copied().unwrap_or(l.total);
                    assert!(end <= next, "batch {i} of {} overlaps the next", c.name);
                }
            }
        }
    }

    #[test]
    fn a_compositions_note_counts_every_slot_and_names_the_first_row() {
        let comp = Composition {
            name: "split",
            batches: vec![vec![4, 2], vec![0, 1, 3]],
        };
        let slots = |v: &[(u64, u64)]| -> Vec<u8> {
            v.iter()
                .flat_map(|&(c, at)| c.to_le_bytes().into_iter().chain(at.to_le_bytes()))
                .collect()
        };
        let clean = slots(&[(0, u64::MAX); 4]);
        assert_eq!(composition_note(&comp, &clean, 2), None);
        // batch 1's second slot: 2 rows, the first at position 1 (row 1)
        let two = slots(&[(0, u64::MAX), (0, u64::MAX), (0, u64::MAX), (2, 1)]);
        assert_eq!(
            composition_note(&comp, &two, 2).unwrap(),
            "2 row(s) differ when recomputed split (e.g. row 1 at position 1 of a batch of 3 rows)"
        );
    }

    #[test]
    fn a_single_row_is_recomputed_inside_a_larger_batch() {
        let p = plan(1, 9);
        assert!(p[0].batches[0].len() >= 2);
        assert_eq!(*p[0].batches[0].last().unwrap(), 0);
    }
}
