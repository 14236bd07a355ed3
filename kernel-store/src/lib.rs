//! kernelize's store: kernels, their sources, verification jobs and records, API tokens and
//! the audit log, on SQLite (the embedded default, one file) or PostgreSQL, chosen by URL,
//! through one set of queries (sqlx's `Any` driver) and per-backend migrations in
//! `migrations/`.
//!
//! Kernels, their sources and verification records are immutable (the schema's triggers refuse
//! updates); jobs are rows claimed with a lease; the audit log is append-only. The pure domain
//! (manifests, digests, reports, policies) lives in `kernel-registry`, which links no database.

mod audit;
mod codec;
mod field;
mod index;
mod jobs;
mod kernel_rows;
mod kernels;
mod matrix;
mod newest;
mod stale;
mod stats;
mod summary;
pub mod testing;
mod tokens;
mod url;
mod verifications;
mod worker_keys;

pub use audit::AuditEntry;
pub use field::{FieldGroup, FieldRow};
pub use index::{RankingInput, VerdictCheck, VerdictIndex};
pub use jobs::{Holder, JobRow, JobState, WidthJob, DEFAULT_MAX_ATTEMPTS};
pub use kernel_rows::{KernelQuery, KernelRow};
pub use kernels::{Inserted, StoredSource};
pub use matrix::{GlanceCell, MatrixFilter, MatrixRow, UnverifiedKernel};
pub use newest::{CandidateKernel, NewestVerdict, VerdictOn, VerdictParts};
pub use stats::{HubStats, MAX_WORKERS_LISTED};
pub use summary::{HEADLINE_COLS, HEADLINE_ROWS};
pub use tokens::{
    hash_token, Expiry, Revoked, TokenCheck, TokenInfo, DEFAULT_TOKEN_LIFETIME, MAX_TOKEN_NAME,
};
pub use url::normalise_url;
pub use verifications::VerificationRow;
pub use worker_keys::WorkerKey;

use kernel_registry::report::{coverage, VerificationReport};
use sqlx::any::AnyPoolOptions;
use sqlx::{AnyPool, Row};
use std::time::Duration;
use verifications::insert_coverage_in;

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
    /// The caller holds a credential, but not the one this needs (e.g. another worker token
    /// than the one that claimed a job).
    #[error("{0}")]
    Forbidden(String),
    /// The request does not fit the stored state (e.g. a report for another kernel).
    #[error("{0}")]
    Invalid(String),
    /// Stored bytes no longer match their digest.
    #[error("stored content is corrupt: {0}")]
    Corrupt(String),
    /// Text the database cannot hold (PostgreSQL refuses NUL in text and `\u0000` in JSON):
    /// the request's fault, never the server's. The HTTP edge refuses such text before it
    /// gets here; this is the last line, so that no backend answers it with a server error.
    #[error("{0}")]
    Unstorable(String),
    #[error("database error: {0}")]
    Db(sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        if let sqlx::Error::Database(db) = &e {
            // 22021 character_not_in_repertoire: a NUL byte in text; 22P05
            // untranslatable_character: `\u0000` in a JSON value.
            if matches!(db.code().as_deref(), Some("22021" | "22P05")) {
                return StoreError::Unstorable(format!(
                    "the database cannot store this text ({}); remove NUL (U+0000) characters",
                    db.message()
                ));
            }
        }
        StoreError::Db(e)
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

pub fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .expect("formatting the current time")
}

pub fn now_ms() -> i64 {
    (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64
}

#[derive(Clone, Debug)]
pub struct Store {
    pool: AnyPool,
    backend: Backend,
    /// The newest verdicts in memory (`VerdictIndex`), shared by the store's clones.
    index: std::sync::Arc<VerdictIndex>,
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
        Ok(Store {
            pool,
            backend,
            index: Default::default(),
        })
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
        self.backfill_summaries().await?;
        Ok(())
    }

    /// Apply the migrations up to `version` and no further: upgrade tests start from the
    /// schema an older release left.
    #[doc(hidden)]
    pub async fn migrate_to(&self, version: i64) -> Result<()> {
        let all = match self.backend {
            Backend::Sqlite => &SQLITE_MIGRATIONS,
            Backend::Postgres => &POSTGRES_MIGRATIONS,
        };
        let older = sqlx::migrate::Migrator {
            migrations: std::borrow::Cow::Owned(
                all.iter()
                    .filter(|m| m.version <= version)
                    .cloned()
                    .collect(),
            ),
            ..sqlx::migrate::Migrator::DEFAULT
        };
        older.run(&self.pool).await?;
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
