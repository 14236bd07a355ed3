//! The worker protocol and the submit answer: request and response bodies of the job routes,
//! defined once and used by the handlers (`api::jobs`, `api::kernels`) and by the clients
//! (`cmd::worker`, `cmd::submit`). A job's JSON is `kernel_store::JobRow`'s serde form.

use kernel_registry::report::{ExactnessClass, VerificationReport};
use kernel_registry::Digest;
use kernel_store::{JobRow, JobState};
use serde::{Deserialize, Serialize};

/// The longest worker name a claim may give (characters); the schema's `maxLength` below.
pub const MAX_WORKER_NAME: usize = 200;
/// The longest reason a re-verification request may give (characters).
pub const MAX_VERIFY_REASON: usize = 500;
/// The longest reason a worker may give for failing a job (characters): stored with the job
/// and in the audit log.
pub const MAX_FAIL_REASON: usize = 2000;

/// `POST /v1/jobs/claim`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimRequest {
    /// A name for this worker (host and GPU), shown in the job and the audit log: one line of
    /// printable text, at most 200 characters.
    #[schema(max_length = 200, pattern = r"^[^\u0000-\u001f\u007f-\u009f]*$")]
    pub worker: String,
    /// The worker's GPU architecture (`sm_90`): it then also gets jobs queued for that
    /// architecture (`kernelize verify-request`), and only jobs of kernels that run there.
    /// Without it, only jobs for any architecture.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, pattern = r"^sm_([3-9]|1[0-9]|20)[0-9]$")]
    pub arch: Option<kernel_registry::Arch>,
}

/// `POST /v1/kernels/{name}/{version}/verify`: queue a verification of a stored kernel on an
/// architecture (admin).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VerifyRequest {
    /// The architecture to verify on (`sm_90`): a worker of it claims the job.
    #[schema(value_type = String, pattern = r"^sm_([3-9]|1[0-9]|20)[0-9]$")]
    pub arch: kernel_registry::Arch,
    /// Why (shown in the audit log): a new GPU, a new driver, a new suite.
    #[serde(default)]
    #[schema(max_length = 500, pattern = r"^[^\u0000]*$")]
    pub reason: Option<String>,
}

/// The kernel a claimed job verifies: its digest and content.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClaimedKernel {
    pub digest: Digest,
    pub manifest_toml: String,
    pub source: String,
}

/// 200 of `POST /v1/jobs/claim`: the job, its lease (a secret shared with the hub only), the
/// claim's nonce and the kernel. Heartbeat, report and fail need the lease and the token that
/// claimed it, before the lease expires.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClaimResponse {
    pub job: JobRow,
    pub lease_id: String,
    /// How long the lease lasts without a heartbeat.
    pub lease_ms: i64,
    /// Fresh at every claim (128 random bits, hex): the report's certificate must name it with
    /// the job id (`kernelize-certificate/2`). Absent from hubs older than issue 26, whose
    /// workers sign `kernelize-certificate/1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<String>,
    pub kernel: ClaimedKernel,
}

/// `POST /v1/jobs/{id}/heartbeat`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatRequest {
    pub lease_id: String,
}

/// 200 of `POST /v1/jobs/{id}/heartbeat`: the lease runs `lease_ms` from now.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HeartbeatResponse {
    pub job_id: i64,
    pub lease_ms: i64,
}

/// `POST /v1/jobs/{id}/report`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReportRequest {
    pub lease_id: String,
    /// A `VerificationReport` (see the verifier). The hub checks it against the job and
    /// derives its summary itself.
    #[schema(value_type = Object)]
    pub report: VerificationReport,
    /// The worker's signed certificate of this report (`kernel_registry::cert`, format
    /// `kernelize-certificate/2`): stored and served with the verification when it verifies
    /// against a registered worker key, binds this report and names this job and the nonce of
    /// its current claim. Required unless the hub runs with `--accept-unsigned-reports`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub certificate: Option<kernel_registry::cert::Certificate>,
}

/// 201 of `POST /v1/jobs/{id}/report`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReportResponse {
    pub verification_id: i64,
    pub url: String,
    /// The overall class the hub derived from the cases.
    pub class: ExactnessClass,
    /// Shapes the job asked for that no case of the report ran.
    pub shapes_not_covered: Vec<String>,
    /// Summary fields whose posted value differed from what the cases give (the hub stored
    /// its own).
    #[serde(default)]
    pub summary_rederived: Vec<String>,
}

/// `POST /v1/jobs/{id}/fail`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FailRequest {
    pub lease_id: String,
    /// Why the job failed: text without NUL (PostgreSQL cannot store it), at most 2,000
    /// characters (`MAX_FAIL_REASON`; utoipa takes only a literal).
    #[schema(max_length = 2000, pattern = r"^[^\u0000]*$")]
    pub reason: String,
}

/// A job as `GET /v1/jobs/{id}` and `POST /v1/jobs/{id}/fail` answer it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobView {
    #[serde(flatten)]
    pub job: JobRow,
    /// Once done: where its verification is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verification_url: Option<String>,
}

impl From<JobRow> for JobView {
    fn from(job: JobRow) -> Self {
        JobView {
            verification_url: job
                .verification_id
                .map(|v| format!("/v1/verifications/{v}")),
            job,
        }
    }
}

/// The job a submission queued (or the kernel's latest, when the content was already stored).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubmittedJob {
    pub id: i64,
    pub state: JobState,
    pub url: String,
}

/// 201/200 of `POST /v1/kernels`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubmitResponse {
    /// False when exactly this content was already stored.
    pub created: bool,
    pub digest: Digest,
    /// The stored kernel, as `GET /v1/kernels` lists it.
    pub kernel: serde_json::Value,
    pub job: Option<SubmittedJob>,
}

/// What a client reads of `GET /v1/verifications/{id}`.
#[derive(Debug, Clone, Deserialize)]
pub struct VerificationRecord {
    pub id: i64,
    pub report: VerificationReport,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each schema's `maxLength` is the constant the docs and the hostile-request tests name
    /// (utoipa takes only a literal).
    #[test]
    fn schema_limits_are_the_constants() {
        let doc = serde_json::to_value(crate::routes::openapi()).unwrap();
        let max = |schema: &str, field: &str| {
            doc["components"]["schemas"][schema]["properties"][field]["maxLength"].as_u64()
        };
        assert_eq!(max("ClaimRequest", "worker"), Some(MAX_WORKER_NAME as u64));
        assert_eq!(
            max("VerifyRequest", "reason"),
            Some(MAX_VERIFY_REASON as u64)
        );
        assert_eq!(max("FailRequest", "reason"), Some(MAX_FAIL_REASON as u64));
    }
}
