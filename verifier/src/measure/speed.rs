//! Speed: median time of launches with the L2 flushed, bytes that must move over that time, and
//! the fraction of this device's copy bandwidth. Every timed launch is checked like any other:
//! its output is poisoned afresh before it (outside the timed region) and compared with the
//! verified output after it, on the GPU (a keyed sum whose key the kernel never sees). A speed
//! above the roofline is an integrity failure, never a record.

use super::CaseRun;
use crate::cases::bytes_moved;
use crate::exec::ExecError;
use kernel_registry::report::Speed;

/// What the timed launches showed: the speed, and each integrity failure they revealed.
pub struct Timed {
    pub speed: Speed,
    pub failures: Vec<String>,
}

/// GB/s of `bytes` moved in `median_us`, and the fraction of `copy_gbps` it is.
pub fn speed_of(bytes: u64, median_us: f64, reference_median_us: f64, copy_gbps: f64) -> Speed {
    let gbps = bytes as f64 / (median_us * 1e-6) / 1e9;
    Speed {
        median_us,
        reference_median_us,
        bytes_moved: bytes,
        gbps,
        copy_fraction: if copy_gbps > 0.0 {
            gbps / copy_gbps
        } else {
            f64::INFINITY
        },
        speedup: reference_median_us / median_us,
    }
}

/// A sentence about the timed launches whose outputs were wrong, when any was.
pub fn wrong_timed_launches(bad: &[usize], reps: usize) -> Option<String> {
    (!bad.is_empty()).then(|| {
        format!(
            "{} of {reps} timed launches left a wrong output (first: timed launch {}): the kernel computes differently when it is timed or called repeatedly",
            bad.len(),
            bad[0] + 1
        )
    })
}

/// Time the candidate (each launch checked) and the reference on the case's buffers.
pub(crate) fn measure(
    run: &CaseRun<'_>,
    expected_out: &[u8],
    expected_res: Option<&[u8]>,
    copy_gbps: f64,
) -> Result<Timed, ExecError> {
    let spec = run.spec;
    let reps = run.limits.speed_reps.max(3) as usize;
    let mut bad = Vec::new();
    let cand_median = run.time_candidate(reps, expected_out, expected_res, &mut bad)?;
    let ref_median = run.time_reference(reps)?;
    let speed = speed_of(
        bytes_moved(spec.op, spec.dtype, spec.rows, spec.cols),
        cand_median,
        ref_median,
        copy_gbps,
    );
    let mut failures: Vec<String> = wrong_timed_launches(&bad, reps).into_iter().collect();
    failures.extend(speed.above_roofline());
    Ok(Timed { speed, failures })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_speed_above_the_roofline_is_a_failure_not_a_record() {
        // 4096 x 8192 bf16 RMSNorm moves 134 MB; in 33 us that is 4 TB/s on a 4.1 TB/s card.
        let bytes = bytes_moved(
            kernel_registry::Op::RmsNorm,
            kernel_registry::DType::Bf16,
            4096,
            8192,
        );
        let fair = speed_of(bytes, 45.0, 450.0, 4100.0);
        assert!(fair.above_roofline().is_none(), "{}", fair.gbps);
        assert!((fair.speedup - 10.0).abs() < 1e-9);
        let skipped = speed_of(bytes, 6.0, 450.0, 4100.0);
        let why = skipped.above_roofline().expect("22 TB/s is impossible");
        assert!(why.contains("roofline"), "{why}");
        // No copy bandwidth measured: nothing can be compared, so nothing is trusted.
        assert!(speed_of(bytes, 45.0, 450.0, 0.0).above_roofline().is_some());
    }

    #[test]
    fn wrong_timed_launches_are_named() {
        assert_eq!(wrong_timed_launches(&[], 25), None);
        let s = wrong_timed_launches(&[3, 4], 25).unwrap();
        assert!(
            s.starts_with("2 of 25 timed launches") && s.contains("timed launch 4"),
            "{s}"
        );
    }
}
