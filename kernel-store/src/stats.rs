//! What `/metrics` reports about the queue and the fleet, read in a few aggregate queries
//! (none grows with a page of rows: each is a count or a bounded list read by index).

use crate::{JobState, Result, Store};
use sqlx::Row;

/// The most workers `HubStats::workers` lists (the most recently seen first).
pub const MAX_WORKERS_LISTED: i64 = 200;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct HubStats {
    /// Jobs per state, every state listed (0 where none).
    pub jobs: Vec<(JobState, i64)>,
    /// When the oldest queued job was created (RFC 3339), if any is queued.
    pub oldest_queued_at: Option<String>,
    /// Verification records per exactness class.
    pub verifications: Vec<(String, i64)>,
    /// Workers by name (`token/worker`) with the last time they were heard from (a claim, or
    /// a heartbeat, report or failure on a job they hold or held), most recent first, at most
    /// `MAX_WORKERS_LISTED`.
    pub workers: Vec<(String, String)>,
    /// How many workers (`token/worker` names) have ever claimed a job.
    pub workers_seen: i64,
    /// Leases that ran out (re-claimed or failed on their last attempt), from the audit log.
    pub lease_expiries: i64,
    /// Running jobs whose lease has run out and that no one has claimed again yet.
    pub leases_expired_now: i64,
}

impl Store {
    /// The hub's counts at `now_ms`.
    pub async fn stats(&self, now_ms: i64) -> Result<HubStats> {
        let mut jobs: Vec<(JobState, i64)> = JobState::ALL.iter().map(|s| (*s, 0)).collect();
        for r in sqlx::query("SELECT state, COUNT(*) AS n FROM verification_jobs GROUP BY state")
            .fetch_all(&self.pool)
            .await?
        {
            let state: String = r.try_get("state")?;
            let n: i64 = r.try_get("n")?;
            if let Some(slot) = jobs.iter_mut().find(|(s, _)| s.as_str() == state) {
                slot.1 = n;
            }
        }
        let oldest_queued_at: Option<String> = sqlx::query(
            "SELECT created_at FROM verification_jobs WHERE state = 'queued' ORDER BY id LIMIT 1",
        )
        .fetch_optional(&self.pool)
        .await?
        .map(|r| r.try_get("created_at"))
        .transpose()?;
        let verifications = sqlx::query(
            // The facts table holds one small row per verification (no report to step over).
            "SELECT class AS exactness_class, COUNT(*) AS n FROM verification_facts \
             GROUP BY class ORDER BY class",
        )
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(|r| Ok((r.try_get("exactness_class")?, r.try_get("n")?)))
        .collect::<Result<Vec<(String, i64)>>>()?;
        // A worker is known by its claims and by the jobs it holds or held (a heartbeat,
        // report or failure stamps them): `workers_seen` keeps its newest stamp (migrations
        // 0008 and 0009), so a scrape reads at most `MAX_WORKERS_LISTED` rows by index.
        let workers = sqlx::query(
            "SELECT worker, last_seen AS seen FROM workers_seen \
             ORDER BY last_seen DESC, worker LIMIT $1",
        )
        .bind(MAX_WORKERS_LISTED)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(|r| Ok((r.try_get("worker")?, r.try_get("seen")?)))
        .collect::<Result<Vec<(String, String)>>>()?;
        let count = |sql: &'static str| async move {
            let n: i64 = sqlx::query(sql).fetch_one(&self.pool).await?.try_get("n")?;
            Ok::<i64, crate::StoreError>(n)
        };
        let leases_expired_now: i64 = sqlx::query(
            "SELECT COUNT(*) AS n FROM verification_jobs \
             WHERE state = 'running' AND lease_expires_ms < $1",
        )
        .bind(now_ms)
        .fetch_one(&self.pool)
        .await?
        .try_get("n")?;
        Ok(HubStats {
            jobs,
            oldest_queued_at,
            verifications,
            workers,
            workers_seen: count("SELECT COUNT(*) AS n FROM workers_seen").await?,
            lease_expiries: count(
                "SELECT COUNT(*) AS n FROM audit_log WHERE action = 'job.lease_expired'",
            )
            .await?,
            leases_expired_now,
        })
    }
}
