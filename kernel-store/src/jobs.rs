//! The verification job queue: jobs are rows, claimed with a lease, re-claimed when a lease
//! expires, retried up to `max_attempts`, completed with a verification record.

use crate::audit::audit_in;
use crate::codec::parse_col;
use crate::codec::random_hex;
use crate::verifications::insert_verification_in;
use crate::{now_ms, now_rfc3339, Backend, Result, Store, StoreError};
use kernel_registry::domain::Digest;
use kernel_registry::report::{ShapeRequest, VerificationReport};
use serde::{Deserialize, Serialize};
use sqlx::any::AnyRow;
use sqlx::Row;

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Waiting for a worker.
    Queued,
    /// Held by a worker's lease.
    Running,
    /// Completed with a verification record.
    Done,
    /// Out of attempts.
    Failed,
}

impl JobState {
    pub const ALL: [JobState; 4] = [
        JobState::Queued,
        JobState::Running,
        JobState::Done,
        JobState::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Done => "done",
            JobState::Failed => "failed",
        }
    }

    /// Queued or running: a worker will still report on it.
    pub fn is_pending(self) -> bool {
        matches!(self, JobState::Queued | JobState::Running)
    }
}

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for JobState {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        JobState::ALL
            .into_iter()
            .find(|j| j.as_str() == s)
            .ok_or_else(|| {
                format!("unknown job state `{s}` (one of queued, running, done, failed)")
            })
    }
}

/// How many times a verification job is tried before it fails for good.
pub const DEFAULT_MAX_ATTEMPTS: i64 = 3;

/// What `Store::queue_width_job` did.
#[derive(Debug, Clone)]
pub enum WidthJob {
    /// A new job was queued.
    Queued(JobRow),
    /// The same kernel and width already had a pending job: this one.
    Existing(JobRow),
    /// This many width jobs are pending, the cap: nothing was queued.
    CapReached(i64),
}

/// A verification job; its serde form is the job JSON of the API (`GET /v1/jobs/{id}`, a claim's
/// `job`), read back by workers and `kernelize submit --wait`. The lease and the claiming token
/// never leave the server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRow {
    pub id: i64,
    pub kernel_digest: Digest,
    pub state: JobState,
    pub attempts: i64,
    pub max_attempts: i64,
    pub worker: Option<String>,
    /// Secret of the current claim; only the claimant knows it.
    #[serde(skip)]
    pub lease_id: Option<String>,
    /// The API token that made the current claim (its id): only it may heartbeat, report or
    /// fail the job.
    #[serde(skip)]
    pub claim_token_id: Option<i64>,
    /// The nonce handed out with the current claim (fresh at every claim, 128 random bits,
    /// hex): the claimant's certificate must name it with the job id. Given to the claimant
    /// alone, with its lease (`ClaimResponse::nonce`), not in the public job JSON.
    #[serde(skip)]
    pub claim_nonce: Option<String>,
    pub lease_expires_ms: Option<i64>,
    pub last_error: Option<String>,
    pub verification_id: Option<i64>,
    pub created_at: String,
    pub updated_at: String,
    /// Shapes to verify besides the suite (empty: the suite alone).
    #[serde(default)]
    pub shapes: Vec<ShapeRequest>,
    /// Set on a job that `/v1/resolve` queued for one unverified row length (or element count
    /// of an elementwise op): that width.
    #[serde(default)]
    pub width_cols: Option<i64>,
    /// The architecture this job is for (`verify-request --arch`); `None`: any. Only a worker
    /// declaring it gets the job, and its report must be from a GPU of it.
    #[serde(default)]
    pub arch: Option<kernel_registry::Arch>,
}

/// The condition (SQL) that the caller holds a job's lease: running, its lease id (parameter
/// `$n`), the token that claimed it (`$n+1`) and a lease that has not expired at `now` (`$n+2`,
/// milliseconds, from Rust, so that both backends compare the same integers). A lease is held
/// up to and including its `lease_expires_ms`; `claim_job_on` takes it over only after
/// (`lease_expires_ms < now`).
fn held(n: usize) -> String {
    format!(
        "lease_id = ${n} AND state = 'running' AND COALESCE(claim_token_id, -1) = COALESCE(${}, -1) \
         AND lease_expires_ms >= ${}",
        n + 1,
        n + 2
    )
}

/// `held`, on a job read already.
fn holds(j: &JobRow, holder: &Holder<'_>, now: i64) -> bool {
    j.state == JobState::Running
        && j.lease_id.as_deref() == Some(holder.lease_id)
        && j.claim_token_id == holder.token_id
        && j.lease_expires_ms.is_some_and(|e| e >= now)
}

/// A claim's nonce: 128 bits from the operating system's CSPRNG, hex.
fn claim_nonce() -> String {
    use rand::RngCore;
    let mut b = [0u8; 16];
    rand::rngs::OsRng.fill_bytes(&mut b);
    hex::encode(b)
}

/// Who calls about a claimed job: the lease secret, the token presented (its id) and a name for
/// the audit log. Heartbeat, report and fail need both the lease and the token that claimed it.
#[derive(Debug, Clone, Copy)]
pub struct Holder<'a> {
    pub lease_id: &'a str,
    pub token_id: Option<i64>,
    pub actor: &'a str,
}

pub(crate) const JOB_COLS: &str =
    "id, kernel_digest, state, attempts, max_attempts, worker, lease_id, claim_token_id, \
    lease_expires_ms, last_error, verification_id, created_at, updated_at, shapes, width_cols, arch, \
    claim_nonce";

fn job_row(r: &AnyRow) -> Result<JobRow> {
    Ok(JobRow {
        id: r.try_get("id")?,
        kernel_digest: parse_col(r, "kernel_digest")?,
        state: parse_col(r, "state")?,
        attempts: r.try_get("attempts")?,
        max_attempts: r.try_get("max_attempts")?,
        worker: r.try_get("worker")?,
        lease_id: r.try_get("lease_id")?,
        claim_token_id: r.try_get("claim_token_id")?,
        claim_nonce: r.try_get("claim_nonce")?,
        lease_expires_ms: r.try_get("lease_expires_ms")?,
        last_error: r.try_get("last_error")?,
        verification_id: r.try_get("verification_id")?,
        created_at: r.try_get("created_at")?,
        updated_at: r.try_get("updated_at")?,
        shapes: serde_json::from_str(&r.try_get::<String, _>("shapes")?)
            .map_err(|e| StoreError::Corrupt(format!("job shapes: {e}")))?,
        width_cols: r.try_get("width_cols")?,
        arch: r
            .try_get::<Option<String>, _>("arch")?
            .map(|a| a.parse())
            .transpose()
            .map_err(|e| StoreError::Corrupt(format!("job arch: {e}")))?,
    })
}

impl Store {
    pub async fn job(&self, id: i64) -> Result<Option<JobRow>> {
        sqlx::query(&format!(
            "SELECT {JOB_COLS} FROM verification_jobs WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?
        .as_ref()
        .map(job_row)
        .transpose()
    }

    pub async fn jobs_for_kernel(&self, digest: &Digest) -> Result<Vec<JobRow>> {
        sqlx::query(&format!(
            "SELECT {JOB_COLS} FROM verification_jobs WHERE kernel_digest = $1 ORDER BY id"
        ))
        .bind(digest.as_str())
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(job_row)
        .collect()
    }

    /// The newest job of each of `digests` (one query), for a page of kernels.
    pub async fn newest_jobs(
        &self,
        digests: &[&Digest],
    ) -> Result<std::collections::HashMap<Digest, JobRow>> {
        let mut out = std::collections::HashMap::new();
        if digests.is_empty() {
            return Ok(out);
        }
        let marks: Vec<String> = (1..=digests.len()).map(|i| format!("${i}")).collect();
        let sql = format!(
            "SELECT {JOB_COLS} FROM verification_jobs WHERE id IN (SELECT MAX(id) FROM \
             verification_jobs WHERE kernel_digest IN ({}) GROUP BY kernel_digest)",
            marks.join(", ")
        );
        let mut q = sqlx::query(&sql);
        for d in digests {
            q = q.bind(d.as_str());
        }
        for r in q.fetch_all(&self.pool).await? {
            let j = job_row(&r)?;
            out.insert(j.kernel_digest.clone(), j);
        }
        Ok(out)
    }

    /// Atomically claim the oldest claimable job for `worker`, presenting the API token
    /// `token_id`, with a lease of `lease_ms`. A running job whose lease expired is claimable
    /// again while it has attempts left; one with none left is failed with its reason. The
    /// claim records the token: only it may heartbeat, report or fail the job.
    pub async fn claim_job(
        &self,
        worker: &str,
        token_id: Option<i64>,
        lease_ms: i64,
    ) -> Result<Option<JobRow>> {
        self.claim_job_on(worker, token_id, lease_ms, None).await
    }

    /// `claim_job` by a worker declaring its GPU's architecture: it gets jobs for any
    /// architecture or for `arch`, of kernels that run there. A worker declaring none gets only
    /// jobs for any architecture.
    pub async fn claim_job_on(
        &self,
        worker: &str,
        token_id: Option<i64>,
        lease_ms: i64,
        arch: Option<kernel_registry::Arch>,
    ) -> Result<Option<JobRow>> {
        let now = now_ms();
        let stamp = now_rfc3339();
        let mut tx = self.pool.begin().await?;
        let expired = sqlx::query(
            "UPDATE verification_jobs SET state = 'failed', updated_at = $1, \
             last_error = 'lease expired on the last attempt (worker ' || COALESCE(worker, '?') || ' stopped reporting)' \
             WHERE state = 'running' AND lease_expires_ms < $2 AND attempts >= max_attempts \
             RETURNING id, kernel_digest",
        )
        .bind(&stamp)
        .bind(now)
        .fetch_all(&mut *tx)
        .await?;
        for r in &expired {
            let id: i64 = r.try_get("id")?;
            let d: String = r.try_get("kernel_digest")?;
            let detail =
                serde_json::json!({"job_id": id, "reason": "lease expired on the last attempt"});
            audit_in(&mut tx, "system", "job.lease_expired", &d, detail.clone()).await?;
            audit_in(&mut tx, "system", "job.failed", &d, detail).await?;
        }
        let lock = match self.backend {
            Backend::Postgres => "FOR UPDATE SKIP LOCKED",
            // SQLite has one writer, and this transaction holds it since the UPDATE above.
            Backend::Sqlite => "",
        };
        // Kernels list their architectures as ",sm_90,sm_80," ("" for any).
        let for_arch = match arch {
            Some(_) => {
                "AND (arch IS NULL OR arch = $2) AND EXISTS (SELECT 1 FROM kernels k \
                 WHERE k.digest = verification_jobs.kernel_digest \
                 AND (k.archs = '' OR k.archs LIKE '%,' || $2 || ',%'))"
            }
            None => "AND arch IS NULL",
        };
        let sql = format!(
            "SELECT id, state, worker, attempts FROM verification_jobs \
             WHERE (state = 'queued' OR (state = 'running' AND lease_expires_ms < $1)) \
             AND attempts < max_attempts {for_arch} ORDER BY id LIMIT 1 {lock}"
        );
        let mut pick = sqlx::query(&sql).bind(now);
        if let Some(a) = arch {
            pick = pick.bind(a.to_string());
        }
        let Some(next) = pick.fetch_optional(&mut *tx).await? else {
            tx.commit().await?;
            return Ok(None);
        };
        let next_id: i64 = next.try_get("id")?;
        let was: String = next.try_get("state")?;
        let lease_id = random_hex(16);
        let nonce = claim_nonce();
        let row = sqlx::query(&format!(
            "UPDATE verification_jobs SET state = 'running', attempts = attempts + 1, worker = $1, \
             lease_id = $2, lease_expires_ms = $3, updated_at = $4, claim_token_id = $5, \
             claim_nonce = $6 WHERE id = $7 RETURNING {JOB_COLS}"
        ))
        .bind(worker)
        .bind(&lease_id)
        .bind(now + lease_ms)
        .bind(&stamp)
        .bind(token_id)
        .bind(&nonce)
        .bind(next_id)
        .fetch_optional(&mut *tx)
        .await?;
        let job = row.as_ref().map(job_row).transpose()?;
        if let (Some(j), true) = (&job, was == JobState::Running.as_str()) {
            // The previous holder's lease ran out: it stopped heart-beating.
            let before: Option<String> = next.try_get("worker")?;
            let attempt: i64 = next.try_get("attempts")?;
            audit_in(
                &mut tx,
                "system",
                "job.lease_expired",
                j.kernel_digest.as_str(),
                serde_json::json!({"job_id": j.id, "attempt": attempt, "worker": before}),
            )
            .await?;
        }
        if let Some(j) = &job {
            audit_in(
                &mut tx,
                worker,
                "job.claimed",
                j.kernel_digest.as_str(),
                serde_json::json!({"job_id": j.id, "attempt": j.attempts, "token_id": token_id}),
            )
            .await?;
        }
        tx.commit().await?;
        Ok(job)
    }

    /// Extend a lease. `Conflict` when the lease is no longer this claimant's (it expired,
    /// whether or not another worker claimed the job since, or the job ended): the worker must
    /// stop. `Forbidden` (audited) when the lease is presented with another token than the one
    /// that claimed it.
    pub async fn heartbeat(&self, job_id: i64, holder: &Holder<'_>, lease_ms: i64) -> Result<()> {
        let now = now_ms();
        let r = sqlx::query(&format!(
            "UPDATE verification_jobs SET lease_expires_ms = $1, updated_at = $2 \
             WHERE id = $3 AND {} RETURNING id",
            held(4)
        ))
        .bind(now + lease_ms)
        .bind(now_rfc3339())
        .bind(job_id)
        .bind(holder.lease_id)
        .bind(holder.token_id)
        .bind(now)
        .fetch_optional(&self.pool)
        .await?;
        match r {
            Some(_) => Ok(()),
            None => Err(self.lease_problem(job_id, holder, "heartbeat").await?),
        }
    }

    /// The job, when `holder` holds its unexpired lease with the token that claimed it;
    /// otherwise why not, as `complete_job` would answer (a token mismatch is audited).
    pub async fn check_holder(&self, job_id: i64, holder: &Holder<'_>) -> Result<JobRow> {
        let now = now_ms();
        match self.job(job_id).await? {
            Some(j) if holds(&j, holder, now) => Ok(j),
            _ => Err(self.lease_problem(job_id, holder, "report").await?),
        }
    }

    /// Record the verdict of a claimed job. Refused when the lease is not the caller's (it
    /// expired, the job was claimed again, or already completed), when it is presented with
    /// another token than the one that claimed the job (audited), or when the report is for
    /// another kernel.
    /// The report's contents are the caller's to check (`kernel_registry::report::validate`).
    pub async fn complete_job(
        &self,
        job_id: i64,
        holder: &Holder<'_>,
        report: &VerificationReport,
    ) -> Result<i64> {
        self.complete_job_certified(job_id, holder, report, None)
            .await
    }

    /// `complete_job`, keeping the worker's certificate of the report with the verification.
    /// The certificate is the caller's to check (`kernel_registry::cert`).
    pub async fn complete_job_certified(
        &self,
        job_id: i64,
        holder: &Holder<'_>,
        report: &VerificationReport,
        certificate: Option<&kernel_registry::cert::Certificate>,
    ) -> Result<i64> {
        let actor = holder.actor;
        let stamp = now_rfc3339();
        let mut tx = self.pool.begin().await?;
        // The lease, its token and its expiry checked in the same statement that ends the job:
        // a claim's lease and nonce change together, so a certificate the caller checked
        // against the claim `check_holder` returned is bound to the claim completed here.
        let Some(r) = sqlx::query(&format!(
            "UPDATE verification_jobs SET state = 'done', lease_expires_ms = NULL, updated_at = $1 \
             WHERE id = $2 AND {} RETURNING kernel_digest",
            held(3)
        ))
        .bind(&stamp)
        .bind(job_id)
        .bind(holder.lease_id)
        .bind(holder.token_id)
        .bind(now_ms())
        .fetch_optional(&mut *tx)
        .await?
        else {
            tx.rollback().await?;
            return Err(self.lease_problem(job_id, holder, "report").await?);
        };
        let digest: String = r.try_get("kernel_digest")?;
        if digest != report.kernel.digest.as_str() {
            tx.rollback().await?;
            return Err(StoreError::Invalid(format!(
                "the report is for kernel {} but job {job_id} verifies {digest}",
                report.kernel.digest
            )));
        }
        let s = &report.summary.overall;
        let vid =
            insert_verification_in(&mut tx, &digest, Some(job_id), report, certificate, &stamp)
                .await?;
        sqlx::query("UPDATE verification_jobs SET verification_id = $1 WHERE id = $2")
            .bind(vid)
            .bind(job_id)
            .execute(&mut *tx)
            .await?;
        audit_in(
            &mut tx,
            actor,
            "verification.recorded",
            &digest,
            serde_json::json!({
                "job_id": job_id, "verification_id": vid, "arch": report.device.arch,
                "device": report.device.name, "class": s.class.to_string(),
            }),
        )
        .await?;
        tx.commit().await?;
        Ok(vid)
    }

    /// A worker gives up on its job (e.g. no GPU can run it). The job is queued again while it
    /// has attempts left, else failed with `reason`. Refused (`Conflict`) once the lease
    /// expired: the next claim takes the job over.
    pub async fn fail_job(&self, job_id: i64, holder: &Holder<'_>, reason: &str) -> Result<JobRow> {
        let actor = holder.actor;
        let stamp = now_rfc3339();
        let mut tx = self.pool.begin().await?;
        let Some(r) = sqlx::query(&format!(
            "UPDATE verification_jobs SET \
             state = CASE WHEN attempts >= max_attempts THEN 'failed' ELSE 'queued' END, \
             last_error = $1, lease_id = NULL, lease_expires_ms = NULL, claim_token_id = NULL, \
             claim_nonce = NULL, updated_at = $2 \
             WHERE id = $3 AND {} RETURNING {JOB_COLS}",
            held(4)
        ))
        .bind(reason)
        .bind(&stamp)
        .bind(job_id)
        .bind(holder.lease_id)
        .bind(holder.token_id)
        .bind(now_ms())
        .fetch_optional(&mut *tx)
        .await?
        else {
            tx.rollback().await?;
            return Err(self.lease_problem(job_id, holder, "fail").await?);
        };
        let job = job_row(&r)?;
        audit_in(
            &mut tx,
            actor,
            "job.attempt_failed",
            job.kernel_digest.as_str(),
            serde_json::json!({"job_id": job_id, "reason": reason, "state": job.state}),
        )
        .await?;
        tx.commit().await?;
        Ok(job)
    }

    /// Why `holder` may not act on the job. The lease presented with another token than the
    /// one that claimed the job is a forgery attempt (a lease id is no credential): it is
    /// audited as `job.claim_token_mismatch`.
    async fn lease_problem(
        &self,
        job_id: i64,
        holder: &Holder<'_>,
        action: &str,
    ) -> Result<StoreError> {
        let now = now_ms();
        Ok(match self.job(job_id).await? {
            None => StoreError::NotFound(format!("no verification job {job_id}")),
            Some(j) if j.state == JobState::Done => StoreError::Conflict(format!(
                "job {job_id} is already complete (verification {})",
                j.verification_id.unwrap_or_default()
            )),
            Some(j)
                if j.state == JobState::Running
                    && j.lease_id.as_deref() == Some(holder.lease_id)
                    && j.claim_token_id != holder.token_id =>
            {
                self.audit(
                    holder.actor,
                    "job.claim_token_mismatch",
                    j.kernel_digest.as_str(),
                    serde_json::json!({
                        "job_id": job_id, "action": action,
                        "claimed_by_token_id": j.claim_token_id, "presented_token_id": holder.token_id,
                    }),
                )
                .await?;
                StoreError::Forbidden(format!(
                    "job {job_id} was claimed by another worker token: its {action} is accepted only from the token that claimed it, with its lease (a lease id alone is no credential); this attempt is recorded in the audit log. Claim a job with your own token (POST /v1/jobs/claim)"
                ))
            }
            Some(j)
                if j.state == JobState::Running
                    && j.lease_id.as_deref() == Some(holder.lease_id)
                    && j.lease_expires_ms.is_some_and(|e| e < now) =>
            {
                let ago = now - j.lease_expires_ms.unwrap_or(now);
                StoreError::Conflict(format!(
                    "job {job_id}'s lease expired {}.{:03} s ago without a heartbeat (attempt {} of {}): an expired lease is refused for heartbeat, report and fail, whether or not another worker has claimed the job since; stop working on it, claim a job again (POST /v1/jobs/claim), and heartbeat well within the claim's lease_ms",
                    ago / 1000,
                    ago % 1000,
                    j.attempts,
                    j.max_attempts
                ))
            }
            Some(j) => StoreError::Conflict(format!(
                "job {job_id} is no longer held by this lease (state {}, attempt {} of {}): it expired and was claimed again, or ended, or was never claimed; stop working on it",
                j.state, j.attempts, j.max_attempts
            )),
        })
    }

    /// Queue a verification of `shape` for a stored kernel on behalf of `/v1/resolve`: the
    /// whole suite plus that shape. At most one such job per (kernel, `shape.cols`) is
    /// pending (queued or running): an identical request gets that job back. While
    /// `max_pending` width jobs are pending in all, nothing is queued (`WidthJob::CapReached`);
    /// on PostgreSQL concurrent requests may pass the cap by a few (it bounds work, it is not
    /// an exact quota).
    pub async fn queue_width_job(
        &self,
        digest: &Digest,
        shape: ShapeRequest,
        arch: kernel_registry::Arch,
        max_pending: i64,
        actor: &str,
    ) -> Result<WidthJob> {
        if let Some(j) = self.pending_width_job(digest, shape.cols, arch).await? {
            return Ok(WidthJob::Existing(j));
        }
        let pending: i64 = sqlx::query(
            "SELECT COUNT(*) AS n FROM verification_jobs \
             WHERE width_cols IS NOT NULL AND state IN ('queued', 'running')",
        )
        .fetch_one(&self.pool)
        .await?
        .try_get("n")?;
        if pending >= max_pending {
            return Ok(WidthJob::CapReached(pending));
        }
        let now = now_rfc3339();
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(&format!(
            "INSERT INTO verification_jobs (kernel_digest, state, attempts, max_attempts, created_at, \
             updated_at, shapes, width_cols, arch) VALUES ($1, 'queued', 0, $2, $3, $4, $5, $6, $7) \
             ON CONFLICT DO NOTHING RETURNING {JOB_COLS}"
        ))
        .bind(digest.as_str())
        .bind(DEFAULT_MAX_ATTEMPTS)
        .bind(&now)
        .bind(&now)
        .bind(serde_json::to_string(&[shape]).expect("shapes serialise"))
        .bind(shape.cols as i64)
        .bind(arch.to_string())
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            // A concurrent request queued it first.
            tx.rollback().await?;
            return match self.pending_width_job(digest, shape.cols, arch).await? {
                Some(j) => Ok(WidthJob::Existing(j)),
                None => Err(StoreError::Conflict(format!(
                    "a verification of {digest} at cols {} was queued and finished concurrently; ask again",
                    shape.cols
                ))),
            };
        };
        let job = job_row(&row)?;
        audit_in(
            &mut tx,
            actor,
            "job.queued_for_width",
            digest.as_str(),
            serde_json::json!({"job_id": job.id, "shape": shape.to_string(), "arch": arch}),
        )
        .await?;
        tx.commit().await?;
        Ok(WidthJob::Queued(job))
    }

    /// Withdraw the suite jobs queued for bundled kernels that an imported verification (a
    /// bundled certificate, no job of this hub) already covers: a fresh hub queues no GPU work
    /// for kernels it holds verified (issue 27 item 4). Only a job no worker ever took is
    /// withdrawn (queued, no attempt, for any architecture and no asked width); each is audited
    /// as `job.withdrawn`. Returns the ids withdrawn.
    pub async fn withdraw_covered_bundled_jobs(&self, actor: &str) -> Result<Vec<i64>> {
        let mut tx = self.pool.begin().await?;
        let rows = sqlx::query(
            "DELETE FROM verification_jobs WHERE state = 'queued' AND attempts = 0 \
             AND arch IS NULL AND width_cols IS NULL \
             AND kernel_digest IN (SELECT digest FROM kernels WHERE origin = 'bundled') \
             AND EXISTS (SELECT 1 FROM verifications v \
                 WHERE v.kernel_digest = verification_jobs.kernel_digest AND v.job_id IS NULL) \
             RETURNING id, kernel_digest",
        )
        .fetch_all(&mut *tx)
        .await?;
        let mut ids = Vec::with_capacity(rows.len());
        for r in rows {
            let id: i64 = r.try_get("id")?;
            let digest: String = r.try_get("kernel_digest")?;
            audit_in(
                &mut tx,
                actor,
                "job.withdrawn",
                &format!("job {id}"),
                serde_json::json!({"digest": digest, "why": "an imported verification (bundled certificate) covers this bundled kernel"}),
            )
            .await?;
            ids.push(id);
        }
        tx.commit().await?;
        ids.sort_unstable();
        Ok(ids)
    }

    /// Queue a verification of a stored kernel on `arch` (`kernelize verify-request`): the whole
    /// suite, for a worker of that architecture; `(job, true)`. The pending job of this kernel
    /// and arch is returned instead when there is one, `(job, false)`. Audited with `why`.
    pub async fn queue_arch_job(
        &self,
        digest: &Digest,
        arch: kernel_registry::Arch,
        actor: &str,
        why: &str,
    ) -> Result<(JobRow, bool)> {
        let pending = || async {
            sqlx::query(&format!(
                "SELECT {JOB_COLS} FROM verification_jobs WHERE kernel_digest = $1 AND arch = $2 \
                 AND state IN ('queued', 'running') ORDER BY id LIMIT 1"
            ))
            .bind(digest.as_str())
            .bind(arch.to_string())
            .fetch_optional(&self.pool)
            .await?
            .as_ref()
            .map(job_row)
            .transpose()
        };
        if let Some(j) = pending().await? {
            return Ok((j, false));
        }
        let now = now_rfc3339();
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(&format!(
            "INSERT INTO verification_jobs (kernel_digest, state, attempts, max_attempts, created_at, \
             updated_at, arch) VALUES ($1, 'queued', 0, $2, $3, $4, $5) \
             ON CONFLICT DO NOTHING RETURNING {JOB_COLS}"
        ))
        .bind(digest.as_str())
        .bind(DEFAULT_MAX_ATTEMPTS)
        .bind(&now)
        .bind(&now)
        .bind(arch.to_string())
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            tx.rollback().await?;
            return match pending().await? {
                Some(j) => Ok((j, false)),
                None => Err(StoreError::Conflict(format!(
                    "a verification of {digest} on {arch} was queued and finished concurrently; ask again"
                ))),
            };
        };
        let job = job_row(&row)?;
        audit_in(
            &mut tx,
            actor,
            "job.queued_for_arch",
            digest.as_str(),
            serde_json::json!({"job_id": job.id, "arch": arch, "why": why}),
        )
        .await?;
        tx.commit().await?;
        Ok((job, true))
    }

    /// The pending (queued or running) width job of a kernel at `cols`, if any.
    pub async fn pending_width_job(
        &self,
        digest: &Digest,
        cols: u64,
        arch: kernel_registry::Arch,
    ) -> Result<Option<JobRow>> {
        sqlx::query(&format!(
            "SELECT {JOB_COLS} FROM verification_jobs WHERE kernel_digest = $1 AND width_cols = $2 \
             AND arch = $3 AND state IN ('queued', 'running') ORDER BY id LIMIT 1"
        ))
        .bind(digest.as_str())
        .bind(cols as i64)
        .bind(arch.to_string())
        .fetch_optional(&self.pool)
        .await?
        .as_ref()
        .map(job_row)
        .transpose()
    }
}

/// Queue a verification job for a stored kernel, inside the caller's transaction.
pub(crate) async fn queue_job_in(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    digest: &Digest,
    now: &str,
) -> Result<i64> {
    Ok(sqlx::query(
        "INSERT INTO verification_jobs (kernel_digest, state, attempts, max_attempts, created_at, updated_at) \
         VALUES ($1, 'queued', 0, $2, $3, $4) RETURNING id",
    )
    .bind(digest.as_str())
    .bind(DEFAULT_MAX_ATTEMPTS)
    .bind(now)
    .bind(now)
    .fetch_one(&mut **tx)
    .await?
    .try_get("id")?)
}

/// Put back in the queue the running jobs claimed by token `token_id` (revoked), inside the
/// caller's transaction; the interrupted attempt does not count. Each is audited as
/// `job.requeued`. Returns their ids.
pub(crate) async fn requeue_claims_of_in(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    token_id: i64,
    reason: &str,
) -> Result<Vec<i64>> {
    let rows = sqlx::query(
        "UPDATE verification_jobs SET state = 'queued', \
         attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END, \
         lease_id = NULL, lease_expires_ms = NULL, claim_token_id = NULL, claim_nonce = NULL, \
         last_error = $1, updated_at = $2 WHERE state = 'running' AND claim_token_id = $3 \
         RETURNING id, kernel_digest",
    )
    .bind(reason)
    .bind(now_rfc3339())
    .bind(token_id)
    .fetch_all(&mut **tx)
    .await?;
    let mut ids = Vec::new();
    for r in &rows {
        let id: i64 = r.try_get("id")?;
        let digest: String = r.try_get("kernel_digest")?;
        audit_in(
            tx,
            "system",
            "job.requeued",
            &digest,
            serde_json::json!({"job_id": id, "reason": reason}),
        )
        .await?;
        ids.push(id);
    }
    ids.sort_unstable();
    Ok(ids)
}
