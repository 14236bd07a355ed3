//! Address cases (docs/spec.md section 3): the candidate again on the case's own inputs, with
//! every tensor at other addresses the ABI allows, its outputs compared bit for bit with launch
//! 1's (at fresh allocations). A fresh allocation starts on a large boundary (the CUDA
//! allocator's, plus the 4 KiB guard), while a user's tensor may be a view 16 bytes into a
//! larger one (a slice of an activation): the same kernel must give the same bits wherever its
//! buffers lie. A kernel can test any low bits of an address (`ptr % 32`, `% 256`, `% 4096`,
//! `% 2 MiB`, ...), so the placements (`plan`) put the buffers at every multiple of the ABI's
//! alignment modulo 256, at every power of two from 256 to 1 MiB, and on a 2 MiB boundary (the
//! `PERIOD`): every test `ptr % 2^k == r` for 2^k <= 256 meets every residue, and every test
//! `ptr % 2^k == 0` up to 2 MiB is met both true and false. A few placements also put the
//! tensors at different residues from each other (a kernel may compare its pointers). Each
//! placed tensor has the guard regions of every buffer on both sides, checked after the launch
//! with the inputs (keyed sums on the GPU, all of one placement downloaded at once).

use super::poison::Poison;
use super::{CaseRun, Launches};
use crate::abi::{abi_tensors, Ptrs, ABI_ALIGN_BYTES};
use crate::cases::CaseInputs;
use crate::cuda::{guard_byte, Arg, DevBuf, Gpu, GUARD_BYTES};
use crate::exec::ExecError;
use crate::numeric::{bits_at, compare, count_bit_differences, is_nan, keyed_sum, worst};
use cudarc::driver::sys::CUfunction;
use kernel_registry::report::Exactness;
use kernel_registry::DType;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Arc;

/// Placements are residues modulo this many bytes (2 MiB: the CUDA allocator's granularity for
/// large buffers, and PyTorch's caching-allocator blocks).
pub const PERIOD: u64 = 1 << 21;

/// The address residues (modulo `PERIOD`) every tensor is placed at: 0 (on a 2 MiB boundary),
/// every other multiple of the ABI's alignment below 256, and every power of two from 256 to
/// 1 MiB.
pub fn residues() -> Vec<u64> {
    let low = (0..256).step_by(ABI_ALIGN_BYTES as usize);
    let high = (8..21).map(|k| 1u64 << k);
    low.chain(high).collect()
}

/// Where one launch's tensors lie: the address residue modulo `PERIOD` of each tensor, in the
/// order of `abi_tensors`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub at: Vec<u64>,
}

/// The placements of a case whose op has `tensors` tensors: all of them together at each of
/// `residues()`, then a few apart (the output at 0 and the inputs at 16, and the reverse; each
/// tensor 16 bytes further than the one before; each on its own power of two).
pub fn plan(tensors: usize) -> Vec<Placement> {
    let a = ABI_ALIGN_BYTES;
    let mut out: Vec<Placement> = residues()
        .into_iter()
        .map(|r| Placement {
            at: vec![r; tensors],
        })
        .collect();
    let apart = [
        (0..tensors).map(|i| if i == 0 { 0 } else { a }).collect(),
        (0..tensors).map(|i| if i == 0 { a } else { 0 }).collect(),
        (0..tensors as u64).map(|i| a * (i + 1)).collect(),
        (0..tensors as u64).map(|i| PERIOD >> (i + 1)).collect(),
    ];
    for at in apart {
        let p = Placement { at };
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// How a person reads a placement: "every buffer at offset 16" or "out at offset 0, x at
/// offset 16, w at offset 16" (bytes past a 2 MiB boundary).
pub fn describe(names: &[&str], p: &Placement) -> String {
    let where_ = if p.at.windows(2).all(|w| w[0] == w[1]) {
        format!(
            "every buffer at offset {}",
            p.at.first().copied().unwrap_or(0)
        )
    } else {
        names
            .iter()
            .zip(&p.at)
            .map(|(n, r)| format!("{n} at offset {r}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!("{where_} (bytes past a {} MiB boundary)", PERIOD >> 20)
}

/// How one output of a placed launch differs from the same output at fresh allocations.
#[derive(Debug, Clone, PartialEq)]
pub struct Difference {
    /// `out`, or fused_add's `residual`.
    pub tensor: String,
    pub differ: u64,
    pub elements: u64,
    /// The first differing element (flat index).
    pub first: u64,
    pub max_abs_diff: f64,
}

impl Difference {
    /// Compare `got` (a placed launch's output) with `want` (launch 1's); `None` when every
    /// element has the same bits (NaN == NaN).
    pub fn of(tensor: &str, dt: DType, got: &[u8], want: &[u8]) -> Option<Difference> {
        let differ = count_bit_differences(dt, got, want);
        if differ == 0 {
            return None;
        }
        let n = want.len() / dt.size_bytes();
        let first = (0..n)
            .find(|&i| {
                let (p, q) = (bits_at(dt, got, i), bits_at(dt, want, i));
                p != q && !(is_nan(dt, p) && is_nan(dt, q))
            })
            .unwrap_or(0) as u64;
        Some(Difference {
            tensor: tensor.to_string(),
            differ,
            elements: n as u64,
            first,
            max_abs_diff: compare(dt, &[(got, want)]).max_abs_diff,
        })
    }
}

/// The integrity line of a case whose output depends on where its buffers lie: the first
/// placement that differed and how, and how many of the placements did.
pub fn address_line(
    names: &[&str],
    first: (&Placement, &[Difference]),
    differing: usize,
    placements: usize,
    cols: u64,
) -> String {
    let (p, diffs) = first;
    let what = diffs
        .iter()
        .map(|d| {
            let cols = cols.max(1);
            format!(
                "{} differs from the fresh allocations' in {} of {} elements (first: row {}, col {}; max abs diff {:.3})",
                d.tensor,
                d.differ,
                d.elements,
                d.first / cols,
                d.first % cols,
                d.max_abs_diff
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    format!(
        "output depends on the buffer address: with {}, {what}; {differing} of {placements} placements differ",
        describe(names, p)
    )
}

/// At most this many lines of guard or input failures at placed addresses per case.
pub(crate) const MAX_OTHER_LINES: usize = 4;

/// What the address cases found in one case.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    /// Integrity failures: a deterministic kernel's output that depends on the address (one
    /// line), guards written and inputs modified at placed addresses (named by placement).
    pub failures: Vec<String>,
    /// A non-deterministic kernel's placed outputs that differ from all of its launches at
    /// fresh allocations: not, alone, evidence of the address, so they are measured against
    /// the reference like its other launches (`exactness`, the worst of them) and said here.
    pub note: Option<String>,
    pub exactness: Option<Exactness>,
}

/// Placements queued together before one wait and one download: the launches between two
/// synchronisations (a case's 33 placements in 5 waits; before, each placement waited for its
/// launch and for its sums). A launch that never ends is found within this many launch limits.
pub(crate) const CHUNK: usize = 8;

/// The keyed sums that check placed buffers after launches: per launch and buffer the sum of
/// its payload and of each of its two guard regions, all queued on the GPU behind the launch
/// (`Placing::sum`) and downloaded at once for up to [`CHUNK`] launches (`take`). One key for every
/// check of a measurement, drawn when it starts (after the candidate's launches), so a kernel
/// cannot forge a sum; the host sums each expected payload once with it ([`PlacedSums::of`]).
pub(crate) struct PlacedSums {
    sums: DevBuf,
    buffers: usize,
    key: u64,
    want_guard: u64,
}

/// One placed buffer after a launch: its payload's keyed sum, and whether both guard regions
/// still hold the guard byte.
pub(crate) struct Summed {
    pub payload: u64,
    pub guards_ok: bool,
}

impl PlacedSums {
    /// Sums for up to [`CHUNK`] launches of `buffers` placed buffers, the key drawn from `seed`
    /// and a fresh state.
    pub(crate) fn new(gpu: &Gpu, buffers: usize, seed: u64) -> Result<Self, ExecError> {
        Self::keyed(gpu, buffers, RandomState::new().hash_one(seed))
    }

    /// Sums with the key of `held` (`CaseRun::expect_all`): a placed buffer that should hold
    /// what one of them was made from sums to its `sum`.
    pub(crate) fn sharing(
        gpu: &Gpu,
        buffers: usize,
        held: &super::Held,
    ) -> Result<Self, ExecError> {
        Self::keyed(gpu, buffers, held.key)
    }

    fn keyed(gpu: &Gpu, buffers: usize, key: u64) -> Result<Self, ExecError> {
        let g = guard_byte();
        Ok(PlacedSums {
            sums: gpu.alloc(8 * 3 * buffers * CHUNK)?,
            buffers,
            key,
            want_guard: keyed_sum(&vec![g; GUARD_BYTES], key, g),
        })
    }

    /// The sum of a buffer whose payload holds `host`.
    pub(crate) fn of(&self, host: &[u8]) -> u64 {
        keyed_sum(host, self.key, guard_byte())
    }

    /// Zero the slots of the next `take`, queued before the launches they follow.
    pub(crate) fn clear(&self, gpu: &Gpu) -> Result<(), ExecError> {
        gpu.fill_queued(&self.sums, 0)
    }

    /// The device address of launch `slot`'s sums (3 words a buffer: payload, guard before,
    /// guard after).
    fn slot(&self, slot: usize) -> u64 {
        assert!(slot < CHUNK);
        self.sums.ptr() + (8 * 3 * slot * self.buffers) as u64
    }

    /// The sums of launches `0..launches`, downloaded at once; the launches must have been
    /// waited for.
    pub(crate) fn take(&self, gpu: &Gpu, launches: usize) -> Result<Vec<Vec<Summed>>, ExecError> {
        let got = gpu.download_vec(&self.sums)?;
        let word = |j: usize| u64::from_le_bytes(got[8 * j..8 * j + 8].try_into().expect("8"));
        Ok((0..launches)
            .map(|l| {
                (0..self.buffers)
                    .map(|i| {
                        let j = 3 * (l * self.buffers + i);
                        Summed {
                            payload: word(j),
                            guards_ok: word(j + 1) == self.want_guard
                                && word(j + 2) == self.want_guard,
                        }
                    })
                    .collect()
            })
            .collect())
    }
}

/// What `kz_place` and `kz_keyed_sums` read for every placement of a plan, in one buffer to
/// upload: each placement's ops (reference.cu's `KzPlaceOp`, one a buffer: 6 u64 and 2 u32,
/// little-endian), then each placement's ranges (`KzRange`, 2 u64: each buffer's payload, guard
/// before and guard after, in that order).
pub(crate) struct Tables {
    pub bytes: Vec<u8>,
    buffers: usize,
    placements: usize,
    /// The most 4-byte words in one allocation, and in one summed range.
    most_words: u64,
    most_summed: u64,
}

impl Tables {
    const OP: usize = 56;
    const RANGE: usize = 16;
    /// Where an op's poison key lies in it (its sixth u64).
    const KEY_AT: usize = 40;

    /// The tables of `plan` for `placed` (moved to each placement in turn: left at the last),
    /// the payloads from `sources` (`None`: fresh poison, a key of its own for each).
    pub(crate) fn of(
        placed: &mut [DevBuf],
        plan: &[Placement],
        sources: &[Option<&DevBuf>],
        guard: u8,
    ) -> Tables {
        let n = placed.len();
        assert_eq!(sources.len(), n);
        let guard_words = (GUARD_BYTES / 4) as u64;
        let mut ops: Vec<u8> = Vec::with_capacity(plan.len() * n * Self::OP);
        let mut ranges: Vec<u8> = Vec::with_capacity(plan.len() * n * 3 * Self::RANGE);
        let (mut most_words, mut most_summed) = (1u64, 1u64);
        for p in plan {
            for ((buf, &residue), source) in placed.iter_mut().zip(&p.at).zip(sources) {
                buf.place(residue, PERIOD);
                let (base, total, lead) = buf.layout();
                let (ptr, bytes) = (buf.ptr(), buf.bytes as u64);
                let src = source.map_or(0, |s| s.ptr());
                for v in [
                    base,
                    total as u64,
                    lead as u64,
                    bytes,
                    src,
                    Poison::fresh().key,
                ] {
                    ops.extend(v.to_le_bytes());
                }
                ops.extend(u32::from(guard).to_le_bytes());
                ops.extend(0u32.to_le_bytes());
                let payload_words = bytes.div_ceil(4);
                let after = (ptr + bytes).next_multiple_of(4);
                for (at, words) in [
                    (ptr, payload_words),
                    (ptr - GUARD_BYTES as u64, guard_words),
                    (after, guard_words),
                ] {
                    ranges.extend(at.to_le_bytes());
                    ranges.extend(words.to_le_bytes());
                }
                most_words = most_words.max(total as u64 / 4 + 1);
                most_summed = most_summed.max(payload_words).max(guard_words);
            }
        }
        ops.extend(ranges);
        Tables {
            bytes: ops,
            buffers: n,
            placements: plan.len(),
            most_words,
            most_summed,
        }
    }

    /// Byte offset of placement `k`'s ops.
    pub(crate) fn op_at(&self, k: u64) -> u64 {
        k * (self.buffers * Self::OP) as u64
    }

    /// Byte offset of placement `k`'s ranges.
    pub(crate) fn ranges_at(&self, k: u64) -> u64 {
        ((self.placements * self.buffers * Self::OP) + k as usize * self.buffers * 3 * Self::RANGE)
            as u64
    }

    /// The poison key of placement `k`'s buffer `i` (what its op asks `kz_place` to write).
    pub(crate) fn key(&self, k: usize, i: usize) -> u64 {
        let at = (k * self.buffers + i) * Self::OP + Self::KEY_AT;
        u64::from_le_bytes(self.bytes[at..at + 8].try_into().expect("8"))
    }

    /// Placement `k`'s ops with a fresh poison key for each buffer (the poison of a placement
    /// placed again: every launch of the candidate gets fresh poison).
    fn fresh_ops(&self, k: usize) -> Vec<u8> {
        let at = k * self.buffers * Self::OP;
        let mut ops = self.bytes[at..at + self.buffers * Self::OP].to_vec();
        for op in ops.chunks_mut(Self::OP) {
            op[Self::KEY_AT..Self::KEY_AT + 8].copy_from_slice(&Poison::fresh().key.to_le_bytes());
        }
        ops
    }
}

/// A case's placements made ready on the GPU: their [`Tables`] uploaded once, and the launches
/// that place a placement's buffers (`kz_place`) and sum them (`kz_keyed_sums`). The one home
/// of what a placed buffer holds and of which of its ranges are summed, for the screening and
/// for the closer look alike.
pub(crate) struct Placing {
    t: Tables,
    table: DevBuf,
    place_f: CUfunction,
    sums_f: CUfunction,
    /// Blocks (x) of a `kz_place` launch and of a `kz_keyed_sums` launch.
    blocks: (u32, u32),
}

impl Placing {
    /// The tables of `plan` for `placed` (left at the last placement) and `sources` (as
    /// [`Tables::of`]), uploaded; `tools`: `kz_place` and `kz_keyed_sums`.
    pub(crate) fn new(
        gpu: &Gpu,
        (place_f, sums_f): (CUfunction, CUfunction),
        plan: &[Placement],
        placed: &mut [DevBuf],
        sources: &[Option<&DevBuf>],
    ) -> Result<Placing, ExecError> {
        let t = Tables::of(placed, plan, sources, guard_byte());
        let table = gpu.alloc(t.bytes.len())?;
        gpu.upload(&table, &t.bytes)?;
        let sms = u64::from(gpu.info.sm_count);
        let blocks = (
            t.most_words.div_ceil(256).clamp(1, 2 * sms) as u32,
            super::sum_blocks(t.most_summed, gpu),
        );
        Ok(Placing {
            t,
            table,
            place_f,
            sums_f,
            blocks,
        })
    }

    /// Move `placed` to placement `p` and queue the `kz_place` of the ops at device address
    /// `ops` (placement `p`'s, as the table holds them or afresh).
    fn put(
        &self,
        gpu: &Gpu,
        p: &Placement,
        ops: u64,
        placed: &mut [DevBuf],
    ) -> Result<(), ExecError> {
        for (buf, &residue) in placed.iter_mut().zip(&p.at) {
            buf.place(residue, PERIOD);
        }
        let n = self.t.buffers as u32;
        gpu.enqueue(
            "placing the buffers",
            self.place_f,
            [self.blocks.0, n, 1],
            [256, 1, 1],
            &[Arg::Ptr(ops)],
        )
    }

    /// Queue placement `k`'s sums into launch `slot` of `sums`.
    fn sum(&self, gpu: &Gpu, k: usize, sums: &PlacedSums, slot: usize) -> Result<(), ExecError> {
        gpu.enqueue(
            "keyed sums on the GPU",
            self.sums_f,
            [self.blocks.1, 3 * self.t.buffers as u32, 1],
            [256, 1, 1],
            &[
                Arg::Ptr(self.table.ptr() + self.t.ranges_at(k as u64)),
                Arg::U64(sums.key),
                Arg::Ptr(sums.slot(slot)),
            ],
        )
    }

    /// Every placement of `plan` (the plan of [`Placing::new`]), screened by keyed sums alone:
    /// per placement `put`, `launch` (the candidate's call queued on `placed`, `call_launches`
    /// launches), `sum`. [`CHUNK`] placements go between two waits (a call that never ends is
    /// found within `CHUNK * call_launches` launch limits). Returns the placements (by index)
    /// where a guard region changed or a payload summed to what `payload_ok(buffer, sums)`
    /// refuses, with their sums: only these are looked at closely ([`Placing::again`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn screen<L, K>(
        &self,
        run: &CaseRun<'_>,
        plan: &[Placement],
        placed: &mut [DevBuf],
        sums: &PlacedSums,
        launch: L,
        (what, call_launches): (&str, usize),
        payload_ok: K,
    ) -> Result<Vec<(usize, Vec<Summed>)>, ExecError>
    where
        L: Fn(&[DevBuf]) -> Result<(), ExecError>,
        K: Fn(usize, &Summed) -> bool,
    {
        let started = std::time::Instant::now();
        let gpu = run.gpu;
        let mut flagged = Vec::new();
        for (c, chunk) in plan.chunks(CHUNK).enumerate() {
            sums.clear(gpu)?;
            for (slot, p) in chunk.iter().enumerate() {
                let k = c * CHUNK + slot;
                self.put(gpu, p, self.table.ptr() + self.t.op_at(k as u64), placed)?;
                launch(placed)?;
                self.sum(gpu, k, sums, slot)?;
            }
            run.wait_queued(what, chunk.len() * call_launches)?;
            for (slot, got) in sums.take(gpu, chunk.len())?.into_iter().enumerate() {
                if !got
                    .iter()
                    .enumerate()
                    .all(|(i, s)| s.guards_ok && payload_ok(i, s))
                {
                    flagged.push((c * CHUNK + slot, got));
                }
            }
        }
        crate::trace(|| {
            format!(
                "{} screening: {} placements {:.2} ms, {} flagged",
                run.spec.id,
                plan.len(),
                1e3 * started.elapsed().as_secs_f64(),
                flagged.len()
            )
        });
        Ok(flagged)
    }

    /// Placement `k` (`p`) again, alone, to look at closely: placed with fresh poison,
    /// `launch` queued and waited for, then its sums. `placed` is left there to download.
    pub(crate) fn again<L>(
        &self,
        run: &CaseRun<'_>,
        (k, p): (usize, &Placement),
        placed: &mut [DevBuf],
        sums: &PlacedSums,
        launch: L,
        (what, call_launches): (&str, usize),
    ) -> Result<Vec<Summed>, ExecError>
    where
        L: Fn(&[DevBuf]) -> Result<(), ExecError>,
    {
        let gpu = run.gpu;
        let ops = self.t.fresh_ops(k);
        let fresh = gpu.alloc(ops.len())?;
        gpu.upload(&fresh, &ops)?;
        sums.clear(gpu)?;
        self.put(gpu, p, fresh.ptr(), placed)?;
        launch(placed)?;
        self.sum(gpu, k, sums, 0)?;
        run.wait_queued(what, call_launches)?;
        Ok(sums.take(gpu, 1)?.remove(0))
    }
}

/// The GPU check of `kz_place` and `kz_keyed_sums` (the screening's own kernels) against their
/// host meaning, for `verifier/tests/gpu.rs` (`tools/placements`): buffers of odd and even
/// sizes, from 2 bytes to past the 2 MiB period, inputs and poisoned outputs, at every placement
/// of the plan; each whole allocation downloaded and compared byte for byte with what it must
/// hold (the guard byte around a copy of the input or the op's poison), and every range's sum
/// with the host's keyed sum of the same bytes. Returns what it compared.
#[doc(hidden)]
pub fn placement_self_check() -> Result<String, String> {
    use crate::cuda::Gpu;
    use kernel_registry::{Op, Semantics};
    let e = |e: ExecError| e.to_string();
    let mut gpu = Gpu::open().map_err(e)?;
    let (rd, src) = crate::ref_module::module(Op::RmsNorm, Semantics::Llama, DType::Bf16);
    gpu.compile(rd, "reference layers", src, &[]).map_err(e)?;
    let place_f = gpu.function(rd, &[], "kz_place").map_err(e)?;
    let sums_f = gpu.function(rd, &[], "kz_keyed_sums").map_err(e)?;
    let sizes = [2usize, 6, 4096, 8190, (2 << 20) + 10];
    let inputs: Vec<Option<(DevBuf, Vec<u8>)>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            if i % 2 == 1 {
                return Ok(None);
            }
            let host: Vec<u8> = (0..n).map(|j| (j * 131 + i * 7 + 1) as u8).collect();
            let b = gpu.alloc(n)?;
            gpu.upload(&b, &host)?;
            Ok(Some((b, host)))
        })
        .collect::<Result<_, ExecError>>()
        .map_err(e)?;
    let sources: Vec<Option<&DevBuf>> = inputs.iter().map(|i| i.as_ref().map(|x| &x.0)).collect();
    let mut placed: Vec<DevBuf> = sizes
        .iter()
        .map(|&n| gpu.alloc_placed(n, PERIOD))
        .collect::<Result<_, _>>()
        .map_err(e)?;
    let plan = plan(sizes.len());
    let g = guard_byte();
    let placing = Placing::new(&gpu, (place_f, sums_f), &plan, &mut placed, &sources).map_err(e)?;
    let n = sizes.len();
    let sums = PlacedSums::new(&gpu, n, 0x5eed).map_err(e)?;
    let mut compared = 0usize;
    for (k, p) in plan.iter().enumerate() {
        sums.clear(&gpu).map_err(e)?;
        let ops = placing.table.ptr() + placing.t.op_at(k as u64);
        placing.put(&gpu, p, ops, &mut placed).map_err(e)?;
        placing.sum(&gpu, k, &sums, 0).map_err(e)?;
        gpu.wait_queued("the placement check", std::time::Duration::from_secs(10))
            .map_err(e)?;
        let got = sums.take(&gpu, 1).map_err(e)?.remove(0);
        for (i, buf) in placed.iter().enumerate() {
            let all = gpu.download_allocation(buf).map_err(e)?;
            let (_, _, lead) = buf.layout();
            let poison = Poison {
                key: placing.t.key(k, i),
                invert: false,
            };
            for (j, &b) in all.iter().enumerate() {
                let want = match j.checked_sub(lead).filter(|&o| o < buf.bytes) {
                    None => g,
                    Some(o) => match &inputs[i] {
                        Some((_, host)) => host[o],
                        None => poison.byte(o),
                    },
                };
                if b != want {
                    return Err(format!(
                        "placement {k} ({}), buffer {i} of {} bytes: byte {j} of the allocation is {b:#04x}, not {want:#04x} (payload at {lead})",
                        describe(&["a", "b", "c", "d", "e"], p),
                        buf.bytes
                    ));
                }
            }
            // the bytes are right: kz_keyed_sums must give the host's sums of them (the
            // payload's; each guard region's is PlacedSums' want_guard, in `guards_ok`)
            let want = sums.of(&all[lead..lead + buf.bytes]);
            if got[i].payload != want || !got[i].guards_ok {
                return Err(format!(
                    "placement {k}, buffer {i}: kz_keyed_sums gave payload {:#x} (the host {want:#x}), guards {}",
                    got[i].payload,
                    if got[i].guards_ok { "as they must be" } else { "not the guard byte's sums" }
                ));
            }
            compared += all.len();
        }
    }
    Ok(format!(
        "{} placements of {n} buffers ({} to {} bytes): {compared} allocation bytes as they must be, {} keyed sums equal to the host's",
        plan.len(),
        sizes[0],
        sizes[n - 1],
        plan.len() * n * 3
    ))
}

/// What a placement's screening launch showed of one buffer (`tensor`, its sums `got`) that a
/// second launch there, looked at closely, did not: the kernel did not do the same thing twice
/// at that address, which a verdict cannot rest on. `payload_ok`: whether its payload summed as
/// wanted (`None`: not checked). Empty when the screening found nothing wrong with it.
pub(crate) fn unrepeated(
    tensor: &str,
    got: &Summed,
    payload_ok: Option<bool>,
    input: bool,
) -> Vec<String> {
    let mut what = Vec::new();
    if payload_ok == Some(false) {
        what.push(if input {
            "the input was modified"
        } else {
            "the payload differed from launch 1's"
        });
    }
    if !got.guards_ok {
        what.push("the guard regions changed");
    }
    what.into_iter()
        .map(|w| format!(
            "{tensor}: {w} after the first launch at this placement (keyed sums on the GPU), but not after a second launch there: the kernel does not do the same thing twice at this address"
        ))
        .collect()
}

/// Run the candidate at every placement of `plan` and compare: outputs bit for bit with launch
/// 1's (a non-deterministic kernel's with any of its launches, and against `reference` when
/// none), inputs unchanged, guards intact.
pub(crate) fn check(
    run: &CaseRun<'_>,
    inp: &CaseInputs,
    launches: &Launches,
    reference: (&[u8], Option<&[u8]>),
    deterministic: bool,
) -> Result<Outcome, ExecError> {
    let (gpu, spec) = (run.gpu, run.spec);
    let names = abi_tensors(spec.op);
    let b = &run.bufs;
    let missing = |n: &str| -> ! { panic!("{}: the case has no {n}", spec.op) };
    // Per tensor: where its contents come from (None: the output, poisoned) and what it must
    // hold after the launch.
    struct Tensor<'t> {
        name: &'static str,
        source: Option<&'t DevBuf>,
        expected: Vec<&'t Arc<Vec<u8>>>,
        input: Option<&'t [u8]>,
    }
    let tensors: Vec<Tensor<'_>> = names
        .iter()
        .map(|&name| match name {
            "out" => Tensor {
                name,
                source: None,
                expected: launches.outs.iter().collect(),
                input: None,
            },
            "residual" => Tensor {
                name,
                source: Some(b.residual.as_ref().unwrap_or_else(|| missing(name))),
                expected: launches.ress.iter().collect(),
                input: None,
            },
            _ => {
                let (src, host) = match name {
                    "x" | "gate" => (Some(&b.x), Some(&inp.x)),
                    "up" => (b.up.as_ref(), inp.up.as_ref()),
                    "w" => (b.weight.as_ref(), inp.weight.as_ref()),
                    "b" => (b.bias.as_ref(), inp.bias.as_ref()),
                    other => unreachable!("{}: unknown ABI tensor `{other}`", spec.op),
                };
                Tensor {
                    name,
                    source: Some(src.unwrap_or_else(|| missing(name))),
                    expected: Vec::new(),
                    input: Some(&host.unwrap_or_else(|| missing(name)).bytes),
                }
            }
        })
        .collect();
    let sums = PlacedSums::new(gpu, tensors.len(), spec.seed)?;
    // What each placed tensor may sum to: an input its host copy, an output any of the
    // candidate's launches at fresh allocations (one, when they agree).
    let want: Vec<Vec<u64>> = tensors
        .iter()
        .map(|t| match t.input {
            Some(host) => vec![sums.of(host)],
            None => {
                assert!(!t.expected.is_empty(), "{}: no launch output", t.name);
                // hashed once per distinct output (a deterministic kernel's are one). Launches
                // that found launch 1's bits share its host copy (`Arc`): a shared copy is the
                // same output without comparing its bytes (a full memcmp of each, hundreds of
                // megabytes at the largest cases).
                let mut distinct: Vec<&Arc<Vec<u8>>> = Vec::new();
                for e in &t.expected {
                    let seen = distinct
                        .iter()
                        .any(|d| Arc::ptr_eq(d, e) || d.as_slice() == e.as_slice());
                    if !seen {
                        distinct.push(e);
                    }
                }
                distinct.into_iter().map(|e| sums.of(e)).collect()
            }
        })
        .collect();
    let mut placed: Vec<DevBuf> = tensors
        .iter()
        .map(|t| {
            let bytes = t.source.map_or(run.out_bytes(), |s| s.bytes);
            gpu.alloc_placed(bytes, PERIOD)
        })
        .collect::<Result<_, _>>()?;
    let placements = plan(tensors.len());
    let sources: Vec<Option<&DevBuf>> = tensors.iter().map(|t| t.source).collect();
    let ptrs_of = |placed: &[DevBuf]| {
        let at = |n: &str| names.iter().position(|&m| m == n).map(|i| placed[i].ptr());
        Ptrs {
            out: at("out").unwrap_or_else(|| missing("out")),
            residual: at("residual"),
            x: at("x")
                .or_else(|| at("gate"))
                .unwrap_or_else(|| missing("x")),
            up: at("up"),
            weight: at("w"),
            bias: at("b"),
        }
    };
    let summed_ok = |i: usize, s: &Summed| want[i].contains(&s.payload);
    let launch = |placed: &[DevBuf]| run.launch_at_queued(&run.cand, ptrs_of(placed), spec.rows);
    let calls = (run.cand.name.as_str(), 1);
    let placing = Placing::new(
        gpu,
        (run.tools.place, run.tools.keyed_sums),
        &placements,
        &mut placed,
        &sources,
    )?;
    let flagged = placing.screen(
        run,
        &placements,
        &mut placed,
        &sums,
        launch,
        calls,
        summed_ok,
    )?;
    let mut first_differing: Option<(Placement, Vec<Difference>)> = None;
    let mut differing = 0usize;
    let mut other: Vec<String> = Vec::new();
    let mut other_more = 0usize;
    let mut exactness: Option<Exactness> = None;
    for (k, screened) in flagged {
        // Again, alone, to see what differs.
        let p = &placements[k];
        let got = placing.again(run, (k, p), &mut placed, &sums, launch, calls)?;
        let mut diffs = Vec::new();
        let mut lines = Vec::new();
        // The placed outputs, for a non-deterministic kernel's exactness: (out, residual).
        let mut outputs: Vec<Option<Vec<u8>>> = vec![None; tensors.len()];
        for (i, (t, buf)) in tensors.iter().zip(&placed).enumerate() {
            let (payload_ok, guards_ok) = (summed_ok(i, &got[i]), got[i].guards_ok);
            if payload_ok && guards_ok {
                continue;
            }
            // Only when something differs: download and say what.
            let now = gpu.download_vec(buf)?;
            match t.input {
                Some(host) if now != host => {
                    let changed = count_bit_differences(spec.dtype, &now, host);
                    lines.push(format!(
                        "input {} was modified by the kernel ({changed} element(s) changed)",
                        t.name
                    ));
                }
                Some(_) => {}
                None => {
                    if !t.expected.iter().any(|e| e.as_slice() == now.as_slice()) {
                        diffs.extend(Difference::of(t.name, spec.dtype, &now, t.expected[0]));
                    }
                    outputs[i] = Some(now);
                }
            }
            let guards = gpu.check_guards(buf)?;
            if !guards_ok && guards.is_empty() {
                lines.push(format!("{}: the guard regions changed", t.name));
            }
            lines.extend(guards.into_iter().map(|l| format!("{}: {l}", t.name)));
        }
        if diffs.is_empty() && lines.is_empty() {
            // Nothing the second time: what the screening launch's sums showed stands (a
            // non-deterministic kernel's output may differ from launch to launch).
            for (i, (t, s)) in tensors.iter().zip(&screened).enumerate() {
                let payload = (t.input.is_some() || deterministic).then(|| summed_ok(i, s));
                lines.extend(unrepeated(t.name, s, payload, t.input.is_some()));
            }
        }
        if !diffs.is_empty() {
            differing += 1;
            if !deterministic {
                // Launch 1's bits where a placed output matched them.
                let of = |name: &str| -> Option<&[u8]> {
                    let i = names.iter().position(|&n| n == name)?;
                    Some(match &outputs[i] {
                        Some(now) => now,
                        None => tensors[i].expected[0].as_slice(),
                    })
                };
                let mut pairs: Vec<(&[u8], &[u8])> = Vec::new();
                pairs.extend(of("out").map(|o| (o, reference.0)));
                if let (Some(r), Some(rr)) = (of("residual"), reference.1) {
                    pairs.push((r, rr));
                }
                let e = compare(spec.dtype, &pairs);
                exactness = Some(match exactness {
                    Some(w) => worst(w, e),
                    None => e,
                });
            }
            first_differing.get_or_insert_with(|| (p.clone(), diffs));
        }
        for l in lines {
            if other.len() < MAX_OTHER_LINES {
                other.push(format!("with {}: {l}", describe(&names, p)));
            } else {
                other_more += 1;
            }
        }
    }
    let mut out = Outcome::default();
    if let Some((p, diffs)) = &first_differing {
        let line = address_line(&names, (p, diffs), differing, placements.len(), spec.cols);
        if deterministic {
            out.failures.push(line);
        } else {
            out.note = Some(format!(
                "{line} (the kernel is not deterministic: counted as more launches, in its exactness)"
            ));
            out.exactness = exactness;
        }
    }
    out.failures.extend(other);
    if other_more > 0 {
        out.failures.push(format!(
            "... and {other_more} more guard or input failure(s) at other placements"
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn addresses(p: &Placement) -> Vec<u64> {
        // Any address with the placement's residue: the allocator's high bits do not matter.
        p.at.iter()
            .map(|r| 0x7f3a_0000_0000 + 5 * PERIOD + r)
            .collect()
    }

    #[test]
    fn every_placement_keeps_the_abi_alignment() {
        for n in 2..=4 {
            for p in plan(n) {
                assert_eq!(p.at.len(), n);
                assert!(p.at.iter().all(|r| r % ABI_ALIGN_BYTES == 0 && *r < PERIOD));
            }
        }
    }

    #[test]
    fn every_residue_modulo_256_is_met_by_every_tensor() {
        for n in 2..=4 {
            let plan = plan(n);
            for t in 0..n {
                let seen: BTreeSet<u64> = plan.iter().map(|p| addresses(p)[t] % 256).collect();
                let all: BTreeSet<u64> = (0..256).step_by(ABI_ALIGN_BYTES as usize).collect();
                assert_eq!(seen, all, "tensor {t} of {n}");
            }
        }
    }

    #[test]
    fn every_boundary_test_up_to_the_period_sees_both_answers() {
        // A kernel that tests `ptr % 2^k == 0` for any 2^k from 32 to 2 MiB, on any tensor,
        // is run both ways (16 is the ABI's own alignment: always true).
        let plan = plan(4);
        for k in 5..=21 {
            let m = 1u64 << k;
            for t in 0..4 {
                let answers: BTreeSet<bool> = plan
                    .iter()
                    .map(|p| addresses(p)[t].is_multiple_of(m))
                    .collect();
                assert_eq!(answers.len(), 2, "ptr % {m} == 0 on tensor {t}");
            }
        }
        // And the offset the issue names: 16 bytes past a large boundary.
        assert!(plan.iter().any(|p| p.at.iter().all(|&r| r == 16)));
    }

    #[test]
    fn some_placements_put_the_tensors_apart() {
        for n in 2..=4 {
            let plan = plan(n);
            // For every pair of tensors, one placement where out and that tensor differ in
            // residue modulo 32 (a kernel comparing its pointers' alignment sees both answers).
            for t in 1..n {
                assert!(
                    plan.iter().any(|p| p.at[0] % 32 != p.at[t] % 32),
                    "{t} of {n}"
                );
                assert!(
                    plan.iter().any(|p| p.at[0] % 32 == p.at[t] % 32),
                    "{t} of {n}"
                );
            }
            for (i, p) in plan.iter().enumerate() {
                assert!(!plan[..i].contains(p), "placement {i} repeated");
            }
        }
        assert_eq!(plan(3).len(), residues().len() + 4);
    }

    #[test]
    fn a_placement_is_described_in_bytes_past_the_boundary() {
        let names = ["out", "x", "w"];
        assert_eq!(
            describe(&names, &Placement { at: vec![16; 3] }),
            "every buffer at offset 16 (bytes past a 2 MiB boundary)"
        );
        assert_eq!(
            describe(
                &names,
                &Placement {
                    at: vec![0, 16, 16]
                }
            ),
            "out at offset 0, x at offset 16, w at offset 16 (bytes past a 2 MiB boundary)"
        );
    }

    #[test]
    fn a_screening_that_a_second_launch_does_not_repeat_is_said_per_finding() {
        let clean = Summed {
            payload: 7,
            guards_ok: true,
        };
        assert!(unrepeated("out", &clean, Some(true), false).is_empty());
        // a non-deterministic kernel's output is not held to launch 1's bits
        assert!(unrepeated("out", &clean, None, false).is_empty());
        let out = unrepeated("out", &clean, Some(false), false);
        assert_eq!(out.len(), 1);
        assert!(
            out[0].starts_with("out: the payload differed from launch 1's after the first launch")
                && out[0].contains("does not do the same thing twice"),
            "{}",
            out[0]
        );
        let written = Summed {
            payload: 7,
            guards_ok: false,
        };
        let x = unrepeated("x", &written, Some(false), true);
        assert_eq!(x.len(), 2, "{x:?}");
        assert!(x[0].starts_with("x: the input was modified"), "{}", x[0]);
        assert!(x[1].starts_with("x: the guard regions changed"), "{}", x[1]);
    }

    fn bf16s(v: &[f32]) -> Vec<u8> {
        v.iter()
            .flat_map(|&x| half::bf16::from_f32(x).to_bits().to_le_bytes())
            .collect()
    }

    #[test]
    fn identical_outputs_are_no_difference_and_nan_equals_nan() {
        let a = bf16s(&[1.0, f32::NAN, -0.5]);
        assert_eq!(Difference::of("out", DType::Bf16, &a, &a), None);
        let mut other_nan = a.clone();
        other_nan[2..4].copy_from_slice(&0x7fc1u16.to_le_bytes());
        assert_eq!(Difference::of("out", DType::Bf16, &other_nan, &a), None);
    }

    #[test]
    fn the_reason_names_the_address_dependence_the_offset_and_the_difference() {
        // The kernel: unnormalised at a 16-byte offset (max diff 1.03).
        let want = bf16s(&[0.5, -1.0, 0.25, 2.0, 0.0, 1.0]);
        let got = bf16s(&[0.5, -1.0, 0.25, 2.0, 1.03125, 1.0]);
        let d = Difference::of("out", DType::Bf16, &got, &want).expect("they differ");
        assert_eq!((d.differ, d.elements, d.first), (1, 6, 4));
        assert!((d.max_abs_diff - 1.03125).abs() < 1e-9);
        let names = ["out", "x", "w"];
        let line = address_line(&names, (&Placement { at: vec![16; 3] }, &[d]), 20, 33, 3);
        assert_eq!(
            line,
            "output depends on the buffer address: with every buffer at offset 16 (bytes past a \
             2 MiB boundary), out differs from the fresh allocations' in 1 of 6 elements (first: \
             row 1, col 1; max abs diff 1.031); 20 of 33 placements differ"
        );
        // fused_add_rms_norm: both outputs named, the tensors apart.
        let r = Difference {
            tensor: "residual".into(),
            differ: 2,
            elements: 6,
            first: 0,
            max_abs_diff: 0.5,
        };
        let line = address_line(
            &["out", "residual", "x", "w"],
            (
                &Placement {
                    at: vec![0, 16, 16, 16],
                },
                &[r],
            ),
            1,
            33,
            3,
        );
        assert!(
            line.starts_with(
                "output depends on the buffer address: with out at offset 0, residual at offset \
                 16, x at offset 16, w at offset 16 (bytes past a 2 MiB boundary), residual \
                 differs from the fresh allocations' in 2 of 6 elements (first: row 0, col 0;"
            ),
            "{line}"
        );
    }
}
