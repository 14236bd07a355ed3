//! Verification jobs for GPU workers (token scope `worker`), and verification records.

use crate::app::{AppState, Caller, Scope};
use crate::error::{rejection, AppError};
use axum::extract::{rejection::JsonRejection, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use kernel_registry::report::{coverage, Summary, VerificationReport, REPORT_SCHEMA_VERSION};
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimBody {
    /// A name for this worker (host and GPU), shown in the job and the audit log.
    pub worker: String,
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseBody {
    pub lease_id: String,
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReportBody {
    pub lease_id: String,
    /// A `VerificationReport` (see the verifier).
    #[schema(value_type = Object)]
    pub report: VerificationReport,
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FailBody {
    pub lease_id: String,
    pub reason: String,
}

fn body<T>(b: Result<Json<T>, JsonRejection>) -> Result<T, AppError> {
    b.map(|Json(t)| t).map_err(rejection)
}

/// Claim the oldest waiting job with a lease. 200 with the job, its lease and the kernel to
/// verify; 204 when there is no work.
#[utoipa::path(post, path = "/v1/jobs/claim", tag = "jobs", request_body = ClaimBody,
    responses((status = 200, description = "A job with its lease and kernel"), (status = 204, description = "No job waiting"),
        (status = 401, description = "No token"), (status = 403, description = "Token lacks scope worker")),
    security(("token" = [])))]
pub async fn claim(
    State(st): State<AppState>,
    caller: Caller,
    b: Result<Json<ClaimBody>, JsonRejection>,
) -> Result<Response, AppError> {
    let who = caller.require(Scope::Worker)?.to_string();
    let b = body(b)?;
    let worker = format!("{who}/{}", b.worker.trim());
    let Some(job) = st.store.claim_job(&worker, st.config.lease_ms).await? else {
        return Ok(StatusCode::NO_CONTENT.into_response());
    };
    let src = st
        .store
        .source(&job.kernel_digest)
        .await?
        .ok_or_else(|| AppError::not_found("the job's kernel source is missing"))?;
    Ok(Json(json!({
        "job": job,
        "lease_id": job.lease_id,
        "lease_ms": st.config.lease_ms,
        "kernel": {
            "digest": job.kernel_digest,
            "manifest_toml": src.manifest_toml,
            "source": src.source,
        },
    }))
    .into_response())
}

/// A job's state (public), with its shape list (`shapes`: widths verified besides the suite;
/// empty for a full-suite job) and, once done, its `verification_url`.
#[utoipa::path(get, path = "/v1/jobs/{id}", tag = "jobs", params(("id" = i64, Path)),
    responses((status = 200, description = "The job"), (status = 404, description = "No such job")))]
pub async fn get_job(
    State(st): State<AppState>,
    _c: Caller,
    Path(id): Path<i64>,
) -> Result<Json<Value>, AppError> {
    let job = st
        .store
        .job(id)
        .await?
        .ok_or_else(|| AppError::not_found(format!("no verification job {id}")))?;
    let mut v = serde_json::to_value(&job).expect("job serialises");
    if let Some(vid) = job.verification_id {
        v["verification_url"] = json!(format!("/v1/verifications/{vid}"));
    }
    Ok(Json(v))
}

/// Extend a lease. 409 when the lease was lost: stop working on the job.
#[utoipa::path(post, path = "/v1/jobs/{id}/heartbeat", tag = "jobs", params(("id" = i64, Path)), request_body = LeaseBody,
    responses((status = 200, description = "Lease extended"), (status = 409, description = "Lease lost")),
    security(("token" = [])))]
pub async fn heartbeat(
    State(st): State<AppState>,
    caller: Caller,
    Path(id): Path<i64>,
    b: Result<Json<LeaseBody>, JsonRejection>,
) -> Result<Json<Value>, AppError> {
    caller.require(Scope::Worker)?;
    let b = body(b)?;
    if st
        .store
        .heartbeat(id, &b.lease_id, st.config.lease_ms)
        .await?
    {
        Ok(Json(json!({"job_id": id, "lease_ms": st.config.lease_ms})))
    } else {
        Err(AppError::new(
            StatusCode::CONFLICT,
            format!("job {id} is no longer held by this lease (it expired and was claimed again, or ended); stop working on it"),
        ))
    }
}

/// Post the verdict of a claimed job. The report must be for the job's kernel digest; its
/// summary is recomputed from its cases here, never taken on trust.
#[utoipa::path(post, path = "/v1/jobs/{id}/report", tag = "jobs", params(("id" = i64, Path)), request_body = ReportBody,
    responses((status = 201, description = "Recorded"), (status = 409, description = "Lease lost or job already complete"),
        (status = 422, description = "Report for another kernel or of another schema version")),
    security(("token" = [])))]
pub async fn report(
    State(st): State<AppState>,
    caller: Caller,
    Path(id): Path<i64>,
    b: Result<Json<ReportBody>, JsonRejection>,
) -> Result<Response, AppError> {
    let who = caller.require(Scope::Worker)?.to_string();
    let mut b = body(b)?;
    if b.report.schema_version != REPORT_SCHEMA_VERSION {
        return Err(AppError::unprocessable(format!(
            "report schema_version {} is not {REPORT_SCHEMA_VERSION}; upgrade the worker",
            b.report.schema_version
        )));
    }
    b.report.summary = Summary::from_cases(&b.report.cases);
    let vid = st
        .store
        .complete_job(id, &b.lease_id, &who, &b.report)
        .await?;
    // A job with a shape list whose report has no case that ran at a requested width: the
    // report still stands as evidence, and the answer says what it lacks.
    let covered: Vec<u64> = coverage(&b.report).iter().map(|c| c.cols).collect();
    let asked = st
        .store
        .job(id)
        .await?
        .map(|j| j.shapes)
        .unwrap_or_default();
    let not_covered: Vec<String> = asked
        .iter()
        .filter(|s| !covered.contains(&s.cols))
        .map(|s| s.to_string())
        .collect();
    if !not_covered.is_empty() {
        tracing::warn!(
            job = id,
            ?not_covered,
            "report does not cover the job's requested shapes"
        );
    }
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "verification_id": vid,
            "url": format!("/v1/verifications/{vid}"),
            "class": b.report.summary.overall.class.to_string(),
            "shapes_not_covered": not_covered,
        })),
    )
        .into_response())
}

/// Give up on a claimed job with a reason; it is queued again while attempts remain.
#[utoipa::path(post, path = "/v1/jobs/{id}/fail", tag = "jobs", params(("id" = i64, Path)), request_body = FailBody,
    responses((status = 200, description = "Re-queued or failed"), (status = 409, description = "Lease lost")),
    security(("token" = [])))]
pub async fn fail(
    State(st): State<AppState>,
    caller: Caller,
    Path(id): Path<i64>,
    b: Result<Json<FailBody>, JsonRejection>,
) -> Result<Json<Value>, AppError> {
    let who = caller.require(Scope::Worker)?.to_string();
    let b = body(b)?;
    let job = st.store.fail_job(id, &b.lease_id, &who, &b.reason).await?;
    Ok(Json(serde_json::to_value(job).expect("job serialises")))
}

/// One verification record with its full report.
#[utoipa::path(get, path = "/v1/verifications/{id}", tag = "verifications", params(("id" = i64, Path)),
    responses((status = 200, description = "The verification"), (status = 404, description = "No such verification")))]
pub async fn verification(
    State(st): State<AppState>,
    _c: Caller,
    Path(id): Path<i64>,
) -> Result<Json<Value>, AppError> {
    let v = st
        .store
        .verification(id)
        .await?
        .ok_or_else(|| AppError::not_found(format!("no verification {id}")))?;
    Ok(Json(
        serde_json::to_value(v).expect("verification serialises"),
    ))
}
