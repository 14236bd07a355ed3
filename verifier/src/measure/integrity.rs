//! Integrity: every output element written (poisoned before each launch), nothing written
//! outside the buffers (guard regions), inputs unchanged (every one: x or a gated op's gate
//! and up, the parameters). Launches that fail or hang are
//! reported by the executor as errors; speeds above the roofline by `speed`.

use super::{poison, CaseRun, Launches};
use crate::cases::{CaseInputs, HostTensor};
use crate::cuda::DevBuf;
use crate::exec::ExecError;
use crate::numeric::count_bit_differences;
use std::sync::Arc;

/// The failure line for `count` never-written elements of a `rows x cols` output.
pub fn unwritten_line(count: u64, first: usize, rows: u64, cols: u64) -> String {
    let i = first as u64;
    format!(
        "output: {count} of {} elements never written (first: row {}, col {})",
        rows * cols,
        i / cols,
        i % cols
    )
}

pub(crate) fn check(
    run: &CaseRun<'_>,
    inp: &CaseInputs,
    launches: &Launches,
    out: &DevBuf,
    res: Option<&DevBuf>,
) -> Result<Vec<String>, ExecError> {
    let (gpu, spec) = (run.gpu, run.spec);
    let mut failures = Vec::new();
    let es = spec.dtype.size_bytes();
    // Launch 2 ran on launch 1's poison inverted in every byte: when both left the same bits
    // (the GPU-side check shared the host copy), every element was written.
    let (unwritten, first) = if Arc::ptr_eq(&launches.outs[0], &launches.outs[1]) {
        (0, None)
    } else {
        poison::never_written(&launches.outs[0], &launches.outs[1], launches.poison, es)
    };
    if unwritten > 0 {
        failures.push(unwritten_line(
            unwritten,
            first.unwrap_or(0),
            spec.rows,
            spec.cols,
        ));
    }
    let b = &run.bufs;
    let mut guarded: Vec<(&str, &DevBuf)> = vec![("out", out), (inp.x.name, &b.x)];
    guarded.extend(b.up.as_ref().map(|u| ("up", u)));
    guarded.extend(res.map(|r| ("residual", r)));
    guarded.extend(b.weight.as_ref().map(|w| ("weight", w)));
    guarded.extend(b.bias.as_ref().map(|w| ("bias", w)));
    for (name, buf) in &guarded {
        for g in gpu.check_guards(buf)? {
            failures.push(format!("{name}: {g}"));
        }
    }
    let mut inputs: Vec<(&HostTensor, &DevBuf)> = vec![(&inp.x, &b.x)];
    if let (Some(t), Some(d)) = (&inp.up, &b.up) {
        inputs.push((t, d));
    }
    if let (Some(t), Some(d)) = (&inp.weight, &b.weight) {
        inputs.push((t, d));
    }
    if let (Some(t), Some(d)) = (&inp.bias, &b.bias) {
        inputs.push((t, d));
    }
    if let (Some(t), Some(d)) = (&inp.residual, &b.residual) {
        // The pristine residual copy is never passed to the candidate; checked anyway.
        inputs.push((t, d));
    }
    for (t, d) in inputs {
        if run.holds(d, &t.bytes)? {
            continue;
        }
        let now = gpu.download_vec(d)?;
        if now != t.bytes {
            let changed = count_bit_differences(spec.dtype, &now, &t.bytes);
            failures.push(format!(
                "input {} was modified by the kernel ({changed} element(s) changed)",
                t.name
            ));
        }
    }
    Ok(failures)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unwritten_line_names_the_first_element() {
        assert_eq!(
            unwritten_line(4096, 7 * 4096, 8, 4096),
            "output: 4096 of 32768 elements never written (first: row 7, col 0)"
        );
    }
}
