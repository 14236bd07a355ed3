//! The speed evidence at the measured shape nearest a query: one rule for the resolver (from
//! a report's cases or from the store's speed rows) and the dashboard.

use super::VerificationReport;
use crate::domain::DType;
use serde::Serialize;

/// The speed evidence at the measured shape nearest to the asked one.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SpeedAt {
    pub rows: u64,
    pub cols: u64,
    pub gbps: f64,
    pub median_us: f64,
    pub copy_fraction: f64,
    pub speedup: f64,
}

/// The speed nearest (in log scale, rows weighted half) to `rows` x `cols` among `speeds`
/// (one dtype's timed cases, in case order; the first of equally near ones wins).
pub fn nearest_speed(
    speeds: impl IntoIterator<Item = SpeedAt>,
    rows: Option<u64>,
    cols: u64,
) -> Option<SpeedAt> {
    let dist = |c: &SpeedAt| {
        let dc = ((c.cols.max(1) as f64) / (cols.max(1) as f64)).log2().abs();
        let dr = rows
            .map(|r| ((c.rows.max(1) as f64) / (r.max(1) as f64)).log2().abs() * 0.5)
            .unwrap_or(0.0);
        dc + dr
    };
    speeds
        .into_iter()
        .min_by(|a, b| dist(a).total_cmp(&dist(b)))
}

/// Every timed case of `dtype` in `report`, in case order, with its index among the cases.
pub fn timed_cases(
    report: &VerificationReport,
    dtype: DType,
) -> impl Iterator<Item = (usize, SpeedAt)> + '_ {
    report
        .cases
        .iter()
        .enumerate()
        .filter(move |(_, c)| c.dtype == dtype)
        .filter_map(|(i, c)| {
            c.speed.as_ref().map(|s| {
                (
                    i,
                    SpeedAt {
                        rows: c.rows,
                        cols: c.cols,
                        gbps: s.gbps,
                        median_us: s.median_us,
                        copy_fraction: s.copy_fraction,
                        speedup: s.speedup,
                    },
                )
            })
        })
}

/// The case of `dtype` with speed nearest to rows x cols.
pub fn speed_at(
    report: &VerificationReport,
    dtype: DType,
    rows: Option<u64>,
    cols: u64,
) -> Option<SpeedAt> {
    nearest_speed(timed_cases(report, dtype).map(|(_, s)| s), rows, cols)
}
