//! What a stored verification's summary tables hold (`verification_facts`, `_verdicts`,
//! `_speeds`), written in the transaction that stores it (`crate::verifications`) or that
//! backfills an older database (`crate::newest`): the rows the verdict index, the stale list
//! and the dashboard read instead of reports, when the verification was measured, and how a
//! speed row is read back (`speed_row`).

use crate::codec::csv;
use crate::Result;
use kernel_registry::cert::Certificate;
use kernel_registry::report::{
    nearest_speed, timed_cases, ExactnessClass, ModelReport, SpeedAt, VerificationReport,
};
use kernel_registry::DType;
use sqlx::any::AnyRow;
use sqlx::Row;

/// The shape whose speed the dashboard's matrix shows (the nearest measured one).
pub const HEADLINE_ROWS: u64 = 4096;
pub const HEADLINE_COLS: u64 = 8192;

/// When a verification was measured and, if no job of this hub produced it, imported: what the
/// API, the resolve answer and the dashboard say, from the report and the stored row alike
/// (`verification_facts` holds the same, written by `insert_summary_in`).
pub(crate) struct MeasuredTimes<'a> {
    pub verified_at: &'a str,
    pub imported_at: Option<&'a str>,
}

impl<'a> MeasuredTimes<'a> {
    pub fn of(
        report: &'a VerificationReport,
        job_id: Option<i64>,
        created_at: &'a str,
    ) -> MeasuredTimes<'a> {
        MeasuredTimes {
            verified_at: &report.started_at,
            imported_at: job_id.is_none().then_some(created_at),
        }
    }
}

fn class_rank(c: ExactnessClass) -> (i64, i64) {
    match c {
        ExactnessClass::BitExact => (0, 0),
        ExactnessClass::MaxUlp(n) => (1, n.min(i64::MAX as u64) as i64),
        ExactnessClass::Tolerance => (2, 0),
        ExactnessClass::Fails => (3, 0),
    }
}

fn clamp_u64(x: u64) -> i64 {
    x.min(i64::MAX as u64) as i64
}

/// A float as a SQL literal: NULL for NaN (which no backend stores alike), else the shortest
/// text that reads back as the same double.
fn float_sql(x: f64) -> String {
    if x.is_nan() {
        "NULL".into()
    } else if x == f64::INFINITY {
        "1e308".into()
    } else if x == f64::NEG_INFINITY {
        "-1e308".into()
    } else {
        format!("{x:?}")
    }
}

/// Store what the index-backed reads need of a verification (its per-dtype verdicts, timed
/// cases and facts), inside the caller's transaction. `created_at` is when this hub stored it,
/// `job_id` the job that produced it (`None`: imported, so `created_at` is its import time).
pub(crate) async fn insert_summary_in(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    verification_id: i64,
    digest: &str,
    job_id: Option<i64>,
    report: &VerificationReport,
    certificate: Option<&Certificate>,
    created_at: &str,
) -> Result<()> {
    let requested = csv(report.requested_shapes.iter().map(|s| s.cols));
    let times = MeasuredTimes::of(report, job_id, created_at);
    sqlx::query(
        "INSERT INTO verification_facts (verification_id, kernel_digest, arch, class, \
         suite_version, driver_version, cert_key, requested_cols, device_name, created_at, \
         verified_at, imported_at, sm_count, threads_per_sm) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
    )
    .bind(verification_id)
    .bind(digest)
    .bind(report.device.arch.to_string())
    .bind(report.summary.overall.class.to_string())
    .bind(&report.suite_version)
    .bind(&report.device.driver_version)
    .bind(certificate.map(|c| c.key.clone()))
    .bind(requested)
    .bind(&report.device.name)
    .bind(created_at)
    .bind(times.verified_at)
    .bind(times.imported_at)
    .bind(i64::from(report.device.sm_count))
    .bind(report.device.threads_per_sm.map(i64::from))
    .execute(&mut **tx)
    .await?;
    for (dtype, v) in &report.summary.per_dtype {
        let models: Vec<&ModelReport> = report.model.iter().filter(|m| m.dtype == *dtype).collect();
        let (rank, ulp) = class_rank(v.class);
        // The two floats are literals: sqlx's Any driver binds a NULL f64 as float4 on
        // PostgreSQL, and NaN has no portable stored form.
        let sql = format!(
            "INSERT INTO verification_verdicts (verification_id, dtype, class, class_rank, \
             class_ulp, cases_run, integrity_ok, mismatches, nonfinite_parity, deterministic, \
             batch_invariant, within_tolerance, max_ulp, models, argmax_failures, verdict_json, \
             models_json, capabilities, capabilities_json, max_abs_diff, max_mismatch_fraction) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, {}, {})",
            float_sql(v.max_abs_diff),
            float_sql(v.max_mismatch_fraction)
        );
        sqlx::query(&sql)
            .bind(verification_id)
            .bind(dtype.to_string())
            .bind(v.class.to_string())
            .bind(rank)
            .bind(ulp)
            .bind(v.cases_run as i64)
            .bind(v.integrity_ok as i64)
            .bind(clamp_u64(v.mismatches))
            .bind(v.nonfinite_parity as i64)
            .bind(v.deterministic as i64)
            .bind(v.batch_invariant as i64)
            .bind(v.within_tolerance as i64)
            .bind(clamp_u64(v.max_ulp))
            .bind(models.len() as i64)
            // `m < 1.0` exactly as the policy reads it (NaN does not fail it).
            .bind(
                models
                    .iter()
                    .filter(|m| m.argmax_match_fraction < 1.0)
                    .count() as i64,
            )
            .bind(serde_json::to_string(v).expect("verdict serialises"))
            .bind(serde_json::to_string(&models).expect("models serialise"))
            // The audit is the kernel's (every dtype's row holds it; `VerificationReport::audit`:
            // a CUDA report from before the audit stands as an unaudited one); NULL: a Python
            // candidate, not audited.
            .bind(capability_flags(report))
            .bind(
                report
                    .audit()
                    .map(|c| serde_json::to_string(&*c).expect("audit serialises")),
            )
            .execute(&mut **tx)
            .await?;
    }
    // Every dtype's timed cases (the report's speeds, whatever its summary says).
    for dtype in DType::ALL {
        let timed: Vec<(usize, SpeedAt)> = timed_cases(report, *dtype).collect();
        let headline = nearest_speed(
            timed.iter().map(|(_, s)| s.clone()),
            Some(HEADLINE_ROWS),
            HEADLINE_COLS,
        );
        let mut marked = false;
        for (i, s) in &timed {
            let is_headline = !marked && headline.as_ref() == Some(s);
            marked |= is_headline;
            let sql = format!(
                "INSERT INTO verification_speeds (verification_id, dtype, case_index, rows, cols, \
                 headline, gbps, median_us, copy_fraction, speedup) \
                 VALUES ($1, $2, $3, $4, $5, $6, {}, {}, {}, {})",
                float_sql(s.gbps),
                float_sql(s.median_us),
                float_sql(s.copy_fraction),
                float_sql(s.speedup)
            );
            if [s.gbps, s.median_us, s.copy_fraction, s.speedup]
                .iter()
                .any(|x| x.is_nan())
            {
                continue; // a timed case without a measurement has no speed to compare
            }
            sqlx::query(&sql)
                .bind(verification_id)
                .bind(dtype.to_string())
                .bind(*i as i64)
                .bind(clamp_u64(s.rows))
                .bind(clamp_u64(s.cols))
                .bind(is_headline as i64)
                .execute(&mut **tx)
                .await?;
        }
    }
    Ok(())
}

/// The stored capability flags of a report (`CapabilityReport::flags` of
/// `VerificationReport::audit`; `None`: a Python candidate, not audited).
fn capability_flags(report: &VerificationReport) -> Option<String> {
    report.audit().and_then(|c| c.flags())
}

/// A `verification_speeds` row's speed, its rows and cols under `prefix` (`""`: the table's own
/// names; `"s_"`: as the dashboard matrix's and field's queries name them).
pub(crate) fn speed_row(r: &AnyRow, prefix: &str) -> Result<SpeedAt> {
    Ok(SpeedAt {
        rows: r.try_get::<i64, _>(format!("{prefix}rows").as_str())? as u64,
        cols: r.try_get::<i64, _>(format!("{prefix}cols").as_str())? as u64,
        gbps: r.try_get("gbps")?,
        median_us: r.try_get("median_us")?,
        copy_fraction: r.try_get("copy_fraction")?,
        speedup: r.try_get("speedup")?,
    })
}
