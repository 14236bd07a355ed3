//! Storage: SQLite (the embedded default, one file) or PostgreSQL, chosen by URL, through one
//! set of queries (sqlx's `Any` driver) and per-backend migrations in `migrations/`.
//!
//! Kernels, their sources and verification records are immutable (the schema's triggers refuse
//! updates); jobs are rows claimed with a lease; the audit log is append-only.

use crate::domain::{Arch, DType, Digest, Op, Semantics};
use crate::manifest::{digest_of, Constraints, KernelBundle, Manifest};
use crate::report::{coverage, Coverage, ShapeRequest, VerificationReport};
use rand::RngCore;
use serde::Serialize;
use sha2::{Digest as _, Sha256};
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Row};
use std::time::Duration;

static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");
static POSTGRES_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");

/// The default database: a SQLite file in the working directory, created on first run.
pub const DEFAULT_DB_URL: &str = "sqlite://kernelize.db";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database URL `{url}`: {why}")]
    BadUrl { url: String, why: String },
    /// The same name and version already hold other content.
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    NotFound(String),
    /// The request does not fit the stored state (e.g. a report for another kernel).
    #[error("{0}")]
    Invalid(String),
    /// Stored bytes no longer match their digest.
    #[error("stored content is corrupt: {0}")]
    Corrupt(String),
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// A stored kernel, as listed by the API.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KernelRow {
    pub id: i64,
    pub name: String,
    pub version: String,
    pub digest: Digest,
    pub op: Op,
    pub semantics: Semantics,
    pub dtypes: Vec<DType>,
    /// Empty: any architecture.
    pub archs: Vec<Arch>,
    pub cols_min: i64,
    pub cols_max: Option<i64>,
    pub cols_multiple_of: i64,
    pub description: String,
    pub license: String,
    pub authors: Vec<String>,
    pub origin: String,
    pub created_at: String,
}

impl KernelRow {
    /// The manifest's constraints, as stored in the row's indexed columns.
    pub fn constraints(&self) -> Constraints {
        Constraints {
            cols_min: self.cols_min as u64,
            cols_max: self.cols_max.map(|c| c as u64),
            cols_multiple_of: self.cols_multiple_of as u64,
            archs: self.archs.clone(),
        }
    }
}

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

/// The result of storing a kernel.
#[derive(Debug, Clone)]
pub enum Inserted {
    /// A new kernel, with the verification job created for it.
    New { kernel: KernelRow, job_id: i64 },
    /// Exactly this content was already stored: nothing changed.
    Existing(KernelRow),
}

impl Inserted {
    pub fn kernel(&self) -> &KernelRow {
        match self {
            Inserted::New { kernel, .. } | Inserted::Existing(kernel) => kernel,
        }
    }
}

#[derive(Debug, Clone)]
pub struct StoredSource {
    pub digest: Digest,
    pub manifest_toml: String,
    pub manifest: Manifest,
    pub source: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobRow {
    pub id: i64,
    pub kernel_digest: Digest,
    /// queued | running | done | failed
    pub state: String,
    pub attempts: i64,
    pub max_attempts: i64,
    pub worker: Option<String>,
    /// Secret of the current claim; only the claimant knows it.
    #[serde(skip)]
    pub lease_id: Option<String>,
    pub lease_expires_ms: Option<i64>,
    pub last_error: Option<String>,
    pub verification_id: Option<i64>,
    pub created_at: String,
    pub updated_at: String,
    /// Shapes to verify besides the suite (empty: the suite alone).
    pub shapes: Vec<ShapeRequest>,
    /// Set on a job that `/v1/resolve` queued for one unverified row length (or element count
    /// of an elementwise op): that width.
    pub width_cols: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VerificationRow {
    pub id: i64,
    pub kernel_digest: Digest,
    pub job_id: Option<i64>,
    pub arch: Arch,
    pub device_name: String,
    pub exactness_class: String,
    pub created_at: String,
    pub report: VerificationReport,
}

#[derive(Debug, Clone, Default)]
pub struct KernelQuery {
    pub op: Option<Op>,
    pub semantics: Option<Semantics>,
    pub dtype: Option<DType>,
    pub arch: Option<Arch>,
    pub limit: i64,
    pub offset: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditEntry {
    pub id: i64,
    pub at: String,
    pub actor: String,
    pub action: String,
    pub subject: String,
    pub detail: serde_json::Value,
}

pub fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .expect("formatting the current time")
}

pub fn now_ms() -> i64 {
    (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64
}

/// sha256 of a token, as stored; the token itself is never stored.
pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

fn random_hex(bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    rand::thread_rng().fill_bytes(&mut b);
    hex::encode(b)
}

fn csv<T: ToString>(items: impl IntoIterator<Item = T>) -> String {
    let parts: Vec<String> = items.into_iter().map(|t| t.to_string()).collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!(",{},", parts.join(","))
    }
}

fn parse_csv<T: std::str::FromStr>(s: &str) -> Result<Vec<T>> {
    s.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.parse()
                .map_err(|_| StoreError::Corrupt(format!("stored list value `{p}`")))
        })
        .collect()
}

fn parse_col<T: std::str::FromStr>(row: &AnyRow, col: &str) -> Result<T> {
    let s: String = row.try_get(col)?;
    s.parse()
        .map_err(|_| StoreError::Corrupt(format!("column {col} holds `{s}`")))
}

/// Normalise what a user passes as `--db`: a URL, or a bare path meaning a SQLite file.
pub fn normalise_url(url: &str) -> Result<(String, Backend)> {
    let bad = |why: &str| StoreError::BadUrl {
        url: url.to_string(),
        why: why.to_string(),
    };
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok((url.to_string(), Backend::Postgres));
    }
    let url = if url.contains("://") || url.starts_with("sqlite:") {
        url.to_string()
    } else if url.is_empty() {
        return Err(bad(
            "it is empty; use sqlite://PATH or postgres://USER@HOST/DB",
        ));
    } else {
        format!("sqlite://{url}")
    };
    if !url.starts_with("sqlite:") {
        return Err(bad(
            "only sqlite://PATH (the default) and postgres://USER@HOST:PORT/DB are supported",
        ));
    }
    // Create the file on first run unless the user chose a mode.
    let url = if url.contains("mode=") || url.contains(":memory:") {
        url
    } else if url.contains('?') {
        format!("{url}&mode=rwc")
    } else {
        format!("{url}?mode=rwc")
    };
    Ok((url, Backend::Sqlite))
}

const KERNEL_COLS: &str = "id, name, version, digest, op, semantics, dtypes, archs, cols_min, \
    cols_max, cols_multiple_of, description, license, authors, origin, created_at";
const JOB_COLS: &str = "id, kernel_digest, state, attempts, max_attempts, worker, lease_id, \
    lease_expires_ms, last_error, verification_id, created_at, updated_at, shapes, width_cols";

fn kernel_row(r: &AnyRow) -> Result<KernelRow> {
    let authors: String = r.try_get("authors")?;
    Ok(KernelRow {
        id: r.try_get("id")?,
        name: r.try_get("name")?,
        version: r.try_get("version")?,
        digest: parse_col(r, "digest")?,
        op: parse_col(r, "op")?,
        semantics: parse_col(r, "semantics")?,
        dtypes: parse_csv(&r.try_get::<String, _>("dtypes")?)?,
        archs: parse_csv(&r.try_get::<String, _>("archs")?)?,
        cols_min: r.try_get("cols_min")?,
        cols_max: r.try_get("cols_max")?,
        cols_multiple_of: r.try_get("cols_multiple_of")?,
        description: r.try_get("description")?,
        license: r.try_get("license")?,
        authors: serde_json::from_str(&authors)
            .map_err(|e| StoreError::Corrupt(format!("authors: {e}")))?,
        origin: r.try_get("origin")?,
        created_at: r.try_get("created_at")?,
    })
}

fn job_row(r: &AnyRow) -> Result<JobRow> {
    Ok(JobRow {
        id: r.try_get("id")?,
        kernel_digest: parse_col(r, "kernel_digest")?,
        state: r.try_get("state")?,
        attempts: r.try_get("attempts")?,
        max_attempts: r.try_get("max_attempts")?,
        worker: r.try_get("worker")?,
        lease_id: r.try_get("lease_id")?,
        lease_expires_ms: r.try_get("lease_expires_ms")?,
        last_error: r.try_get("last_error")?,
        verification_id: r.try_get("verification_id")?,
        created_at: r.try_get("created_at")?,
        updated_at: r.try_get("updated_at")?,
        shapes: serde_json::from_str(&r.try_get::<String, _>("shapes")?)
            .map_err(|e| StoreError::Corrupt(format!("job shapes: {e}")))?,
        width_cols: r.try_get("width_cols")?,
    })
}

fn verification_row(r: &AnyRow) -> Result<VerificationRow> {
    let json: String = r.try_get("report_json")?;
    Ok(VerificationRow {
        id: r.try_get("id")?,
        kernel_digest: parse_col(r, "kernel_digest")?,
        job_id: r.try_get("job_id")?,
        arch: parse_col(r, "arch")?,
        device_name: r.try_get("device_name")?,
        exactness_class: r.try_get("exactness_class")?,
        created_at: r.try_get("created_at")?,
        report: serde_json::from_str(&json)
            .map_err(|e| StoreError::Corrupt(format!("verification report: {e}")))?,
    })
}

/// How many times a verification job is tried before it fails for good.
pub const DEFAULT_MAX_ATTEMPTS: i64 = 3;

#[derive(Clone, Debug)]
pub struct Store {
    pool: AnyPool,
    backend: Backend,
}

impl Store {
    /// Connect (creating a SQLite file on first use) and bring the schema up to date.
    pub async fn open(url: &str) -> Result<Store> {
        let store = Self::connect(url).await?;
        store.migrate().await?;
        Ok(store)
    }

    /// Connect without migrating.
    pub async fn connect(url: &str) -> Result<Store> {
        sqlx::any::install_default_drivers();
        let (url, backend) = normalise_url(url)?;
        // SQLite allows one writer at a time; one connection serialises writers instead of
        // having them fail with SQLITE_BUSY under load. PostgreSQL gets a real pool.
        let max = match backend {
            Backend::Sqlite => 1,
            Backend::Postgres => 16,
        };
        let pool = AnyPoolOptions::new()
            .max_connections(max)
            .acquire_timeout(Duration::from_secs(30))
            .connect(&url)
            .await
            .map_err(|e| StoreError::BadUrl {
                url: url.clone(),
                why: format!("cannot connect: {e}"),
            })?;
        if backend == Backend::Sqlite {
            // WAL survives in the file; a committed transaction survives a killed process.
            sqlx::query("PRAGMA journal_mode=WAL")
                .execute(&pool)
                .await?;
            sqlx::query("PRAGMA foreign_keys=ON").execute(&pool).await?;
            sqlx::query("PRAGMA synchronous=FULL")
                .execute(&pool)
                .await?;
        }
        Ok(Store { pool, backend })
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    pub async fn migrate(&self) -> Result<()> {
        match self.backend {
            Backend::Sqlite => SQLITE_MIGRATIONS.run(&self.pool).await?,
            Backend::Postgres => POSTGRES_MIGRATIONS.run(&self.pool).await?,
        }
        self.backfill_coverage().await?;
        Ok(())
    }

    /// Coverage rows for verifications stored before migration 0002 (SQL cannot read the
    /// report JSON): computed here from each report. Returns how many verifications it filled.
    /// A report whose cases all errored covers nothing and is looked at again on each start.
    pub async fn backfill_coverage(&self) -> Result<usize> {
        let rows = sqlx::query(
            "SELECT v.id, v.report_json FROM verifications v WHERE NOT EXISTS \
             (SELECT 1 FROM verification_coverage c WHERE c.verification_id = v.id) ORDER BY v.id",
        )
        .fetch_all(&self.pool)
        .await?;
        let mut filled = 0;
        for r in &rows {
            let id: i64 = r.try_get("id")?;
            let json: String = r.try_get("report_json")?;
            let report: VerificationReport = serde_json::from_str(&json)
                .map_err(|e| StoreError::Corrupt(format!("verification {id}: report: {e}")))?;
            let cov = coverage(&report);
            if cov.is_empty() {
                continue;
            }
            let mut tx = self.pool.begin().await?;
            insert_coverage_in(&mut tx, id, &cov).await?;
            tx.commit().await?;
            filled += 1;
        }
        Ok(filled)
    }

    pub async fn close(&self) {
        self.pool.close().await
    }

    // ---- kernels ------------------------------------------------------------------------

    /// Store a kernel (source by digest, kernel row, verification job) in one transaction.
    /// The same content again is a no-op; the same name and version with other content is a
    /// `Conflict`.
    pub async fn insert_kernel(
        &self,
        bundle: &KernelBundle,
        origin: &str,
        actor: &str,
    ) -> Result<Inserted> {
        let m = &bundle.manifest;
        let digest = bundle.digest();
        let now = now_rfc3339();
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO sources (digest, manifest_toml, manifest_json, source, created_at) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (digest) DO NOTHING",
        )
        .bind(digest.as_str())
        .bind(&bundle.manifest_toml)
        .bind(serde_json::to_string(m).expect("manifest serialises"))
        .bind(&bundle.source)
        .bind(&now)
        .execute(&mut *tx)
        .await?;
        let inserted = sqlx::query(&format!(
            "INSERT INTO kernels (name, version, digest, op, semantics, dtypes, archs, cols_min, \
             cols_max, cols_multiple_of, description, license, authors, origin, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) \
             ON CONFLICT DO NOTHING RETURNING {KERNEL_COLS}"
        ))
        .bind(&m.name)
        .bind(m.version.to_string())
        .bind(digest.as_str())
        .bind(m.op.as_str())
        .bind(m.semantics.as_str())
        .bind(csv(m.entries.keys()))
        .bind(csv(&m.constraints.archs))
        .bind(m.constraints.cols_min as i64)
        .bind(m.constraints.cols_max.map(|c| c as i64))
        .bind(m.constraints.cols_multiple_of as i64)
        .bind(&m.description)
        .bind(&m.license)
        .bind(serde_json::to_string(&m.authors).expect("authors serialise"))
        .bind(origin)
        .bind(&now)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = inserted else {
            tx.rollback().await?;
            if let Some(k) = self.kernel_by_digest(&digest).await? {
                return Ok(Inserted::Existing(k));
            }
            let version = m.version.to_string();
            return match self.kernel(&m.name, &version).await? {
                Some(k) => Err(StoreError::Conflict(format!(
                    "{} {} is already stored with other content (digest {}); kernels are immutable: publish a new version",
                    m.name, version, k.digest
                ))),
                None => Err(StoreError::Conflict(format!(
                    "{} {} could not be stored: a concurrent write conflicted; try again",
                    m.name, version
                ))),
            };
        };
        let kernel = kernel_row(&row)?;
        let job_id = queue_job_in(&mut tx, &digest, &now).await?;
        audit_in(
            &mut tx,
            actor,
            "kernel.created",
            &format!("{} {}", m.name, m.version),
            serde_json::json!({"digest": digest, "origin": origin, "job_id": job_id}),
        )
        .await?;
        tx.commit().await?;
        Ok(Inserted::New { kernel, job_id })
    }

    pub async fn kernel(&self, name: &str, version: &str) -> Result<Option<KernelRow>> {
        sqlx::query(&format!(
            "SELECT {KERNEL_COLS} FROM kernels WHERE name = $1 AND version = $2"
        ))
        .bind(name)
        .bind(version)
        .fetch_optional(&self.pool)
        .await?
        .as_ref()
        .map(kernel_row)
        .transpose()
    }

    pub async fn kernel_by_digest(&self, digest: &Digest) -> Result<Option<KernelRow>> {
        sqlx::query(&format!(
            "SELECT {KERNEL_COLS} FROM kernels WHERE digest = $1"
        ))
        .bind(digest.as_str())
        .fetch_optional(&self.pool)
        .await?
        .as_ref()
        .map(kernel_row)
        .transpose()
    }

    /// Kernels matching the filters, newest name/version order, with the total count.
    pub async fn list_kernels(&self, q: &KernelQuery) -> Result<(Vec<KernelRow>, i64)> {
        // Filters are bound in a fixed order so the `$n` numbering is ascending in the text.
        let mut conds = Vec::new();
        let mut binds: Vec<String> = Vec::new();
        if let Some(op) = q.op {
            binds.push(op.to_string());
            conds.push(format!("op = ${}", binds.len()));
        }
        if let Some(s) = q.semantics {
            binds.push(s.to_string());
            conds.push(format!("semantics = ${}", binds.len()));
        }
        if let Some(d) = q.dtype {
            binds.push(format!("%,{d},%"));
            conds.push(format!("dtypes LIKE ${}", binds.len()));
        }
        if let Some(a) = q.arch {
            binds.push(format!("%,{a},%"));
            conds.push(format!("(archs = '' OR archs LIKE ${})", binds.len()));
        }
        let filter = if conds.is_empty() {
            String::new()
        } else {
            format!("WHERE {}", conds.join(" AND "))
        };
        let count_sql = format!("SELECT COUNT(*) AS n FROM kernels {filter}");
        let mut count = sqlx::query(&count_sql);
        for b in &binds {
            count = count.bind(b.clone());
        }
        let total: i64 = count.fetch_one(&self.pool).await?.try_get("n")?;
        let n = binds.len();
        let sql = format!(
            "SELECT {KERNEL_COLS} FROM kernels {filter} ORDER BY op, semantics, name, id LIMIT ${} OFFSET ${}",
            n + 1,
            n + 2
        );
        let mut list = sqlx::query(&sql);
        for b in &binds {
            list = list.bind(b.clone());
        }
        let rows = list
            .bind(q.limit)
            .bind(q.offset)
            .fetch_all(&self.pool)
            .await?;
        let kernels = rows.iter().map(kernel_row).collect::<Result<Vec<_>>>()?;
        Ok((kernels, total))
    }

    /// A kernel's manifest and source by digest, re-checked against the digest on read.
    pub async fn source(&self, digest: &Digest) -> Result<Option<StoredSource>> {
        let Some(r) = sqlx::query(
            "SELECT digest, manifest_toml, manifest_json, source FROM sources WHERE digest = $1",
        )
        .bind(digest.as_str())
        .fetch_optional(&self.pool)
        .await?
        else {
            return Ok(None);
        };
        let manifest_json: String = r.try_get("manifest_json")?;
        let manifest: Manifest = serde_json::from_str(&manifest_json)
            .map_err(|e| StoreError::Corrupt(format!("{digest}: manifest: {e}")))?;
        let source: String = r.try_get("source")?;
        let actual = digest_of(&manifest, &source);
        if &actual != digest {
            return Err(StoreError::Corrupt(format!(
                "{digest}: the stored manifest and source hash to {actual}"
            )));
        }
        Ok(Some(StoredSource {
            digest: digest.clone(),
            manifest_toml: r.try_get("manifest_toml")?,
            manifest,
            source,
        }))
    }

    // ---- verification jobs ----------------------------------------------------------------

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

    /// Atomically claim the oldest claimable job for `worker` with a lease of `lease_ms`.
    /// A running job whose lease expired is claimable again while it has attempts left;
    /// one with none left is failed with its reason.
    pub async fn claim_job(&self, worker: &str, lease_ms: i64) -> Result<Option<JobRow>> {
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
            audit_in(
                &mut tx,
                "system",
                "job.failed",
                &d,
                serde_json::json!({"job_id": id, "reason": "lease expired on the last attempt"}),
            )
            .await?;
        }
        let lock = match self.backend {
            Backend::Postgres => "FOR UPDATE SKIP LOCKED",
            // SQLite has one writer: the UPDATE below is atomic as it stands.
            Backend::Sqlite => "",
        };
        let lease_id = random_hex(16);
        let row = sqlx::query(&format!(
            "UPDATE verification_jobs SET state = 'running', attempts = attempts + 1, worker = $1, \
             lease_id = $2, lease_expires_ms = $3, updated_at = $4 \
             WHERE id = (SELECT id FROM verification_jobs \
                 WHERE (state = 'queued' OR (state = 'running' AND lease_expires_ms < $5)) \
                 AND attempts < max_attempts ORDER BY id LIMIT 1 {lock}) \
             RETURNING {JOB_COLS}"
        ))
        .bind(worker)
        .bind(&lease_id)
        .bind(now + lease_ms)
        .bind(&stamp)
        .bind(now)
        .fetch_optional(&mut *tx)
        .await?;
        let job = row.as_ref().map(job_row).transpose()?;
        if let Some(j) = &job {
            audit_in(
                &mut tx,
                worker,
                "job.claimed",
                j.kernel_digest.as_str(),
                serde_json::json!({"job_id": j.id, "attempt": j.attempts}),
            )
            .await?;
        }
        tx.commit().await?;
        Ok(job)
    }

    /// Extend a lease. `false` when the lease is no longer this claimant's (it expired and
    /// another worker claimed the job, or the job ended): the worker must stop.
    pub async fn heartbeat(&self, job_id: i64, lease_id: &str, lease_ms: i64) -> Result<bool> {
        let r = sqlx::query(
            "UPDATE verification_jobs SET lease_expires_ms = $1, updated_at = $2 \
             WHERE id = $3 AND lease_id = $4 AND state = 'running' RETURNING id",
        )
        .bind(now_ms() + lease_ms)
        .bind(now_rfc3339())
        .bind(job_id)
        .bind(lease_id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(r.is_some())
    }

    /// Record the verdict of a claimed job. Refused when the lease is not the caller's (the
    /// job was claimed again, or already completed) or the report is for another kernel.
    pub async fn complete_job(
        &self,
        job_id: i64,
        lease_id: &str,
        actor: &str,
        report: &VerificationReport,
    ) -> Result<i64> {
        let stamp = now_rfc3339();
        let mut tx = self.pool.begin().await?;
        let Some(r) = sqlx::query(
            "UPDATE verification_jobs SET state = 'done', lease_expires_ms = NULL, updated_at = $1 \
             WHERE id = $2 AND lease_id = $3 AND state = 'running' RETURNING kernel_digest",
        )
        .bind(&stamp)
        .bind(job_id)
        .bind(lease_id)
        .fetch_optional(&mut *tx)
        .await?
        else {
            tx.rollback().await?;
            return Err(self.lease_problem(job_id).await?);
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
        let vid: i64 = sqlx::query(
            "INSERT INTO verifications (kernel_digest, job_id, arch, device_name, exactness_class, \
             max_ulp, max_mismatch_fraction, max_abs_diff, deterministic, batch_invariant, \
             integrity_ok, gbps_4096x8192, gbps_32768x4096, report_json, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) RETURNING id",
        )
        .bind(&digest)
        .bind(job_id)
        .bind(report.device.arch.to_string())
        .bind(&report.device.name)
        .bind(s.class.to_string())
        .bind(s.max_ulp.min(i64::MAX as u64) as i64)
        .bind(finite_or(s.max_mismatch_fraction, 1.0))
        .bind(finite_or(s.max_abs_diff, f64::MAX))
        .bind(s.deterministic as i64)
        .bind(s.batch_invariant as i64)
        .bind(s.integrity_ok as i64)
        .bind(s.gbps_4096x8192)
        .bind(s.gbps_32768x4096)
        .bind(serde_json::to_string(report).expect("report serialises"))
        .bind(&stamp)
        .fetch_one(&mut *tx)
        .await?
        .try_get("id")?;
        sqlx::query("UPDATE verification_jobs SET verification_id = $1 WHERE id = $2")
            .bind(vid)
            .bind(job_id)
            .execute(&mut *tx)
            .await?;
        insert_coverage_in(&mut tx, vid, &coverage(report)).await?;
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
    /// has attempts left, else failed with `reason`.
    pub async fn fail_job(
        &self,
        job_id: i64,
        lease_id: &str,
        actor: &str,
        reason: &str,
    ) -> Result<JobRow> {
        let stamp = now_rfc3339();
        let mut tx = self.pool.begin().await?;
        let Some(r) = sqlx::query(&format!(
            "UPDATE verification_jobs SET \
             state = CASE WHEN attempts >= max_attempts THEN 'failed' ELSE 'queued' END, \
             last_error = $1, lease_id = NULL, lease_expires_ms = NULL, updated_at = $2 \
             WHERE id = $3 AND lease_id = $4 AND state = 'running' RETURNING {JOB_COLS}"
        ))
        .bind(reason)
        .bind(&stamp)
        .bind(job_id)
        .bind(lease_id)
        .fetch_optional(&mut *tx)
        .await?
        else {
            tx.rollback().await?;
            return Err(self.lease_problem(job_id).await?);
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

    async fn lease_problem(&self, job_id: i64) -> Result<StoreError> {
        Ok(match self.job(job_id).await? {
            None => StoreError::NotFound(format!("no verification job {job_id}")),
            Some(j) if j.state == "done" => StoreError::Conflict(format!(
                "job {job_id} is already complete (verification {})",
                j.verification_id.unwrap_or_default()
            )),
            Some(j) => StoreError::Conflict(format!(
                "job {job_id} is not held by this lease (state {}, attempt {} of {}): it expired and was claimed again, or was never claimed",
                j.state, j.attempts, j.max_attempts
            )),
        })
    }

    // ---- verifications --------------------------------------------------------------------

    pub async fn verification(&self, id: i64) -> Result<Option<VerificationRow>> {
        sqlx::query("SELECT * FROM verifications WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .as_ref()
            .map(verification_row)
            .transpose()
    }

    pub async fn verifications_for_kernel(&self, digest: &Digest) -> Result<Vec<VerificationRow>> {
        sqlx::query("SELECT * FROM verifications WHERE kernel_digest = $1 ORDER BY id DESC")
            .bind(digest.as_str())
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(verification_row)
            .collect()
    }

    /// (id, arch) of every verification of a kernel, newest first, without reading reports.
    pub async fn verification_archs(&self, digest: &Digest) -> Result<Vec<(i64, Arch)>> {
        sqlx::query("SELECT id, arch FROM verifications WHERE kernel_digest = $1 ORDER BY id DESC")
            .bind(digest.as_str())
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|r| Ok((r.try_get("id")?, parse_col(r, "arch")?)))
            .collect()
    }

    /// What a verification covered (per dtype and row length), from the coverage table;
    /// `dtype` narrows it to one dtype. Sorted by (dtype, cols).
    pub async fn coverage(
        &self,
        verification_id: i64,
        dtype: Option<DType>,
    ) -> Result<Vec<Coverage>> {
        let mut q = String::from(
            "SELECT dtype, cols, rows_min, rows_max, row_counts FROM verification_coverage \
             WHERE verification_id = $1",
        );
        if dtype.is_some() {
            q.push_str(" AND dtype = $2");
        }
        q.push_str(" ORDER BY dtype, cols");
        let mut query = sqlx::query(&q).bind(verification_id);
        if let Some(d) = dtype {
            query = query.bind(d.to_string());
        }
        query
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|r| {
                let i = |c: &str| -> Result<u64> { Ok(r.try_get::<i64, _>(c)? as u64) };
                Ok(Coverage {
                    dtype: parse_col(r, "dtype")?,
                    cols: i("cols")?,
                    rows_min: i("rows_min")?,
                    rows_max: i("rows_max")?,
                    row_counts: parse_csv(&r.try_get::<String, _>("row_counts")?)?,
                })
            })
            .collect()
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
        max_pending: i64,
        actor: &str,
    ) -> Result<WidthJob> {
        if let Some(j) = self.pending_width_job(digest, shape.cols).await? {
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
             updated_at, shapes, width_cols) VALUES ($1, 'queued', 0, $2, $3, $4, $5, $6) \
             ON CONFLICT DO NOTHING RETURNING {JOB_COLS}"
        ))
        .bind(digest.as_str())
        .bind(DEFAULT_MAX_ATTEMPTS)
        .bind(&now)
        .bind(&now)
        .bind(serde_json::to_string(&[shape]).expect("shapes serialise"))
        .bind(shape.cols as i64)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            // A concurrent request queued it first.
            tx.rollback().await?;
            return match self.pending_width_job(digest, shape.cols).await? {
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
            serde_json::json!({"job_id": job.id, "shape": shape.to_string()}),
        )
        .await?;
        tx.commit().await?;
        Ok(WidthJob::Queued(job))
    }

    /// The pending (queued or running) width job of a kernel at `cols`, if any.
    pub async fn pending_width_job(&self, digest: &Digest, cols: u64) -> Result<Option<JobRow>> {
        sqlx::query(&format!(
            "SELECT {JOB_COLS} FROM verification_jobs WHERE kernel_digest = $1 AND width_cols = $2 \
             AND state IN ('queued', 'running') ORDER BY id LIMIT 1"
        ))
        .bind(digest.as_str())
        .bind(cols as i64)
        .fetch_optional(&self.pool)
        .await?
        .as_ref()
        .map(job_row)
        .transpose()
    }

    /// The newest verification of every kernel on `arch` (or on any arch), joined to its
    /// kernel, for the resolver and the dashboard.
    pub async fn latest_verifications(
        &self,
        op: Option<Op>,
        arch: Option<Arch>,
    ) -> Result<Vec<(KernelRow, VerificationRow)>> {
        let kernels = self
            .list_kernels(&KernelQuery {
                op,
                limit: i64::MAX,
                ..Default::default()
            })
            .await?
            .0;
        let mut out = Vec::new();
        for k in kernels {
            let mut q = String::from("SELECT * FROM verifications WHERE kernel_digest = $1");
            if arch.is_some() {
                q.push_str(" AND arch = $2");
            }
            q.push_str(" ORDER BY id DESC LIMIT 1");
            let mut query = sqlx::query(&q).bind(k.digest.as_str());
            if let Some(a) = arch {
                query = query.bind(a.to_string());
            }
            if let Some(r) = query.fetch_optional(&self.pool).await? {
                out.push((k, verification_row(&r)?));
            }
        }
        Ok(out)
    }

    // ---- tokens ---------------------------------------------------------------------------

    /// Create a token; the plaintext is returned once and only its hash is stored.
    pub async fn create_token(&self, name: &str, scopes: &[String]) -> Result<String> {
        let token = format!("kz_{}", random_hex(24));
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO api_tokens (name, token_hash, scopes, created_at) VALUES ($1, $2, $3, $4)",
        )
        .bind(name)
        .bind(hash_token(&token))
        .bind(csv(scopes))
        .bind(now_rfc3339())
        .execute(&mut *tx)
        .await?;
        audit_in(
            &mut tx,
            "admin",
            "token.created",
            name,
            serde_json::json!({"scopes": scopes}),
        )
        .await?;
        tx.commit().await?;
        Ok(token)
    }

    /// The (name, scopes) of a live token.
    pub async fn token(&self, token: &str) -> Result<Option<(String, Vec<String>)>> {
        let r = sqlx::query(
            "SELECT name, scopes FROM api_tokens WHERE token_hash = $1 AND revoked_at IS NULL",
        )
        .bind(hash_token(token))
        .fetch_optional(&self.pool)
        .await?;
        match r {
            None => Ok(None),
            Some(r) => Ok(Some((
                r.try_get("name")?,
                parse_csv(&r.try_get::<String, _>("scopes")?)?,
            ))),
        }
    }

    // ---- audit ----------------------------------------------------------------------------

    pub async fn audit(
        &self,
        actor: &str,
        action: &str,
        subject: &str,
        detail: serde_json::Value,
    ) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        audit_in(&mut tx, actor, action, subject, detail).await?;
        tx.commit().await?;
        Ok(())
    }

    pub async fn audit_entries(&self, limit: i64) -> Result<Vec<AuditEntry>> {
        sqlx::query("SELECT id, at, actor, action, subject, detail FROM audit_log ORDER BY id DESC LIMIT $1")
            .bind(limit)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|r| {
                let detail: String = r.try_get("detail")?;
                Ok(AuditEntry {
                    id: r.try_get("id")?,
                    at: r.try_get("at")?,
                    actor: r.try_get("actor")?,
                    action: r.try_get("action")?,
                    subject: r.try_get("subject")?,
                    detail: serde_json::from_str(&detail)
                        .map_err(|e| StoreError::Corrupt(format!("audit detail: {e}")))?,
                })
            })
            .collect()
    }

    /// The first column of the first row of a raw query, as i64 (tests use it to look inside).
    #[doc(hidden)]
    pub async fn scalar_raw(&self, sql: &str) -> Result<i64> {
        Ok(sqlx::query(sql).fetch_one(&self.pool).await?.try_get(0)?)
    }

    /// Run a raw statement (tests use it to check that the schema refuses changes).
    #[doc(hidden)]
    pub async fn execute_raw(&self, sql: &str) -> Result<u64> {
        Ok(sqlx::query(sql).execute(&self.pool).await?.rows_affected())
    }
}

fn finite_or(x: f64, or: f64) -> f64 {
    if x.is_finite() {
        x
    } else {
        or
    }
}

/// Store a verification's coverage rows, inside the caller's transaction (idempotent).
async fn insert_coverage_in(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    verification_id: i64,
    cov: &[Coverage],
) -> Result<()> {
    for c in cov {
        sqlx::query(
            "INSERT INTO verification_coverage (verification_id, dtype, cols, rows_min, rows_max, \
             row_counts) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
        )
        .bind(verification_id)
        .bind(c.dtype.to_string())
        .bind(c.cols as i64)
        .bind(c.rows_min as i64)
        .bind(c.rows_max as i64)
        .bind(csv(&c.row_counts))
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// Queue a verification job for a stored kernel, inside the caller's transaction.
async fn queue_job_in(
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

async fn audit_in(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    actor: &str,
    action: &str,
    subject: &str,
    detail: serde_json::Value,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO audit_log (at, actor, action, subject, detail) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(now_rfc3339())
    .bind(actor)
    .bind(action)
    .bind(subject)
    .bind(detail.to_string())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Test support shared by this crate's tests and the server's end-to-end tests.
#[doc(hidden)]
pub mod testing {
    use super::Store;

    /// The URL of a fresh PostgreSQL database for one test, or `None` (with a loud message)
    /// when no server answers — unless `KERNELIZE_REQUIRE_POSTGRES=1` (set by `.ci/run`),
    /// which makes that a failure. The server is `KERNELIZE_TEST_POSTGRES`, default
    /// `postgres://postgres@127.0.0.1:5432/test`.
    pub async fn fresh_postgres_url(what: &str) -> Option<String> {
        let admin = std::env::var("KERNELIZE_TEST_POSTGRES")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
        let required = std::env::var("KERNELIZE_REQUIRE_POSTGRES").as_deref() == Ok("1");
        let skip = |why: String| {
            // Straight to the stderr handle: libtest captures `eprintln!` of passing tests,
            // and a skip must be seen.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "\n*** SKIPPING PostgreSQL {what}: {why}\n*** set KERNELIZE_REQUIRE_POSTGRES=1 to make this a failure\n"
            );
        };
        // A quick probe, so that a machine without PostgreSQL skips at once instead of
        // waiting out the pool's connect timeout in every test.
        if !required && !reachable(&admin) {
            skip(format!("nothing answers at {admin}"));
            return None;
        }
        let store = match Store::connect(&admin).await {
            Ok(s) => s,
            Err(e) if !required => {
                skip(e.to_string());
                return None;
            }
            Err(e) => panic!("PostgreSQL is required (KERNELIZE_REQUIRE_POSTGRES=1) but: {e}"),
        };
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_nanos();
        let db = format!("kz_test_{nanos:x}_{}", std::process::id());
        store
            .execute_raw(&format!("CREATE DATABASE {db}"))
            .await
            .expect("creating a test database");
        store.close().await;
        let base = admin.rsplit_once('/').expect("URL with a database").0;
        Some(format!("{base}/{db}"))
    }

    /// Whether a TCP connection to the URL's host:port opens within 2 s.
    fn reachable(url: &str) -> bool {
        use std::net::ToSocketAddrs;
        let rest = url.split_once("://").map(|(_, r)| r).unwrap_or(url);
        let host_port = rest.rsplit_once('@').map(|(_, h)| h).unwrap_or(rest);
        let host_port = host_port.split(['/', '?']).next().unwrap_or("");
        let host_port = if host_port.contains(':') {
            host_port.to_string()
        } else {
            format!("{host_port}:5432")
        };
        host_port.to_socket_addrs().is_ok_and(|mut addrs| {
            addrs.any(|a| {
                std::net::TcpStream::connect_timeout(&a, std::time::Duration::from_secs(2)).is_ok()
            })
        })
    }
}
