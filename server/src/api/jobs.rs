//! Verification jobs for GPU workers (token scope `worker`), and verification records.
//!
//! A claim records the token that made it: heartbeat, report and fail are accepted only from
//! that token with the claim's lease, and only before the lease expires (409 after, whether or
//! not another worker claimed the job since). Each claim hands out a fresh nonce: a report's
//! certificate must name the job and that nonce, so that a valid certificate posted for another
//! job (a replay) is refused (403, audited). A report is checked against its job before it is stored
//! (`kernel_registry::report::validate`), and its summary is the hub's own derivation.

use crate::error::{rejection, AppError};
use crate::protocol::{
    ClaimRequest, ClaimResponse, ClaimedKernel, FailRequest, HeartbeatRequest, HeartbeatResponse,
    JobView, ReportRequest, ReportResponse,
};
use crate::state::{AppState, Caller, Scope};
use axum::extract::{rejection::JsonRejection, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use kernel_registry::report::{coverage, rederive, validate, Expected, PlannedCase};
use kernel_registry::{DType, Manifest, VerificationReport};
use kernel_store::Holder;
use serde_json::{json, Value};

fn body<T>(b: Result<Json<T>, JsonRejection>) -> Result<T, AppError> {
    b.map(|Json(t)| t).map_err(rejection)
}

/// Claim the oldest waiting job with a lease. 200 with the job, its lease, the claim's nonce
/// (which the report's certificate must name with the job id) and the kernel to verify; 204
/// when there is no work. Only the token that claims a job may report on it.
#[utoipa::path(post, path = "/v1/jobs/claim", tag = "jobs", request_body = ClaimRequest,
    responses((status = 200, description = "A job with its lease (`lease_id`, `lease_ms`), the claim's `nonce` and the kernel"), (status = 204, description = "No job waiting"),
        (status = 401, description = "No token, or an unknown, expired or revoked one"), (status = 403, description = "Token lacks scope worker")),
    security(("token" = [])))]
pub async fn claim(
    State(st): State<AppState>,
    caller: Caller,
    b: Result<Json<ClaimRequest>, JsonRejection>,
) -> Result<Response, AppError> {
    let who = caller.require(Scope::Worker)?.to_string();
    let b = body(b)?;
    // The edge has held the body to `ClaimRequest`'s schema: one line of printable text, at
    // most 200 characters.
    let name = b.worker.trim();
    let worker = format!("{who}/{name}");
    let Some(job) = st
        .store
        .claim_job_on(&worker, caller.token_id, st.config.lease_ms, b.arch)
        .await?
    else {
        return Ok(StatusCode::NO_CONTENT.into_response());
    };
    let src = st
        .store
        .source(&job.kernel_digest)
        .await?
        .ok_or_else(|| AppError::not_found("the job's kernel source is missing"))?;
    let lease_id = job.lease_id.clone().unwrap_or_default();
    Ok(Json(ClaimResponse {
        lease_id,
        lease_ms: st.config.lease_ms,
        nonce: job.claim_nonce.clone(),
        kernel: ClaimedKernel {
            digest: job.kernel_digest.clone(),
            manifest_toml: src.manifest_toml,
            source: src.source,
        },
        job,
    })
    .into_response())
}

/// A job's state (public), with its shape list (`shapes`: widths verified besides the suite;
/// empty for a full-suite job) and, once done, its `verification_url`.
#[utoipa::path(get, path = "/v1/jobs/{id}", tag = "jobs", params(("id" = i64, Path, minimum = 1)),
    responses((status = 200, description = "The job"), (status = 404, description = "No such job")))]
pub async fn get_job(
    State(st): State<AppState>,
    _c: Caller,
    Path(id): Path<i64>,
) -> Result<Json<JobView>, AppError> {
    let job = st
        .store
        .job(id)
        .await?
        .ok_or_else(|| AppError::not_found(format!("no verification job {id}")))?;
    Ok(Json(job.into()))
}

/// Extend a lease. 409 when the lease expired (whether or not another worker claimed the job
/// since) or was lost: stop working on the job; 403 when the lease is presented with another
/// token than the one that claimed the job.
#[utoipa::path(post, path = "/v1/jobs/{id}/heartbeat", tag = "jobs", params(("id" = i64, Path, minimum = 1)), request_body = HeartbeatRequest,
    responses((status = 200, description = "Lease extended"), (status = 403, description = "Another token claimed the job"), (status = 404, description = "No such job"),
        (status = 409, description = "Lease expired or lost")),
    security(("token" = [])))]
pub async fn heartbeat(
    State(st): State<AppState>,
    caller: Caller,
    Path(id): Path<i64>,
    b: Result<Json<HeartbeatRequest>, JsonRejection>,
) -> Result<Json<HeartbeatResponse>, AppError> {
    let who = caller.require(Scope::Worker)?;
    let b = body(b)?;
    let holder = Holder {
        lease_id: &b.lease_id,
        token_id: caller.token_id,
        actor: who,
    };
    st.store.heartbeat(id, &holder, st.config.lease_ms).await?;
    Ok(Json(HeartbeatResponse {
        job_id: id,
        lease_ms: st.config.lease_ms,
    }))
}

/// The cases the suite draws for this report, when the hub runs the same suite version as
/// the report's verifier: the dtypes in the order the report ran them, its seed, quick flag
/// and requested shapes.
fn suite_cases(report: &VerificationReport, manifest: &Manifest) -> Option<Vec<PlannedCase>> {
    if report.suite_version != verifier::cases::SUITE_VERSION {
        return None;
    }
    let mut dtypes: Vec<DType> = Vec::new();
    for c in &report.cases {
        if !dtypes.contains(&c.dtype) && manifest.entries.contains_key(&c.dtype) {
            dtypes.push(c.dtype);
        }
    }
    let specs = verifier::cases::suite(
        manifest.op,
        manifest.semantics,
        &dtypes,
        report.quick,
        report.seed,
        &report.requested_shapes,
    );
    Some(
        specs
            .into_iter()
            .map(|s| PlannedCase {
                distribution: s.dist.to_string(),
                eps: s.op.takes_eps().then_some(s.eps),
                id: s.id,
                dtype: s.dtype,
                rows: s.rows,
                cols: s.cols,
            })
            .collect(),
    )
}

/// A report's certificate: signed by a registered, unrevoked worker key (else 403), over this
/// report (whose summary must be the one its cases give: the hub stores what was signed) and
/// this job's kernel (else 422), naming this job and the nonce of its current claim (else 403:
/// a valid certificate presented for another job or claim is a replay, refused like another
/// token's lease). Every refusal is audited. Without a certificate, the report is refused when
/// the hub requires signatures.
async fn check_certificate(
    st: &AppState,
    who: &str,
    job: &kernel_store::JobRow,
    b: &ReportRequest,
    rederived: &[String],
) -> Result<(), AppError> {
    let (job_id, digest) = (job.id, &job.kernel_digest);
    let Some(cert) = &b.certificate else {
        if st.config.require_signed_reports {
            return Err(AppError::unprocessable(
                "this hub stores only signed reports: give the worker a key (`kernelize worker-key init --file KEY`), have an admin register its public key (`kernelize worker-key register --key-file KEY`), and start the worker with `--key-file KEY` (or run the hub with `--accept-unsigned-reports`)",
            )
            .with("field", "certificate"));
        }
        return Ok(());
    };
    let refuse = |status: StatusCode, why: String| async move {
        // The job and nonce the certificate names, when its claims parse: a replay's trace.
        let named = kernel_registry::cert::Claims::parse(&cert.claims).ok();
        st.store
            .audit(
                who,
                "verification.certificate_refused",
                digest.as_str(),
                json!({
                    "job_id": job_id, "key_id": cert.key_id(), "why": why,
                    "certificate_job_id": named.as_ref().and_then(|c| c.job_id),
                    "certificate_nonce": named.as_ref().and_then(|c| c.nonce.clone()),
                }),
            )
            .await?;
        Err::<(), AppError>(AppError::new(status, why).with("field", "certificate"))
    };
    match st.store.worker_key(&cert.key).await? {
        None => {
            return refuse(
                StatusCode::FORBIDDEN,
                format!(
                    "the certificate is signed by key {}, which is not registered on this hub; an admin registers it with `kernelize worker-key register`",
                    cert.key_id()
                ),
            )
            .await
        }
        Some(k) if k.revoked_at.is_some() => {
            return refuse(
                StatusCode::FORBIDDEN,
                format!("the certificate is signed by worker key `{}`, revoked", k.name),
            )
            .await
        }
        Some(_) => {}
    }
    let checked = cert.verify_signature().and_then(|claims| {
        claims.check_kernel(digest)?;
        claims.check_report(&b.report)?;
        Ok(claims)
    });
    let claims = match checked {
        Ok(c) => c,
        Err(e) => {
            let also = if rederived.is_empty() {
                String::new()
            } else {
                format!(
                    " (the report's summary was not the one its cases give: {})",
                    rederived.join(", ")
                )
            };
            return refuse(StatusCode::UNPROCESSABLE_ENTITY, format!("{e}{also}")).await;
        }
    };
    // `check_holder` returned the job as claimed now; `complete_job_certified` ends it only
    // under the same lease, which changes with the nonce.
    let nonce = job.claim_nonce.as_deref().unwrap_or_default();
    if let Err(e) = claims.check_job(job_id, nonce) {
        return refuse(StatusCode::FORBIDDEN, e.to_string()).await;
    }
    Ok(())
}

/// Post the verdict of a claimed job, with the lease and the token that claimed it. The report
/// is checked against the job (kernel, suite and verifier versions, shapes), the device it
/// names (known GPUs' architecture and peak bandwidth) and itself (every derived figure, every
/// count and speed against the shapes and the roofline, the suite's case list where the hub
/// can draw it); its summary is derived here from its cases, never taken on trust. Its
/// certificate must name this job and the nonce of the claim (403 otherwise, audited).
#[utoipa::path(post, path = "/v1/jobs/{id}/report", tag = "jobs", params(("id" = i64, Path, minimum = 1)), request_body = ReportRequest,
    responses((status = 201, description = "Recorded"),
        (status = 403, description = "Another token claimed the job; or the certificate's key is not registered or revoked; or the certificate was issued for another job or claim, or names none (a replay; audited)"),
        (status = 404, description = "No such job"),
        (status = 409, description = "Lease expired or lost, or job already complete"),
        (status = 422, description = "The report does not fit the job or holds impossible values; `field` names the first, `problems` lists them")),
    security(("token" = [])))]
pub async fn report(
    State(st): State<AppState>,
    caller: Caller,
    Path(id): Path<i64>,
    b: Result<Json<ReportRequest>, JsonRejection>,
) -> Result<Response, AppError> {
    let who = caller.require(Scope::Worker)?.to_string();
    let mut b = body(b)?;
    let holder = Holder {
        lease_id: &b.lease_id,
        token_id: caller.token_id,
        actor: &who,
    };
    let job = st.store.check_holder(id, &holder).await?;
    let src = st
        .store
        .source(&job.kernel_digest)
        .await?
        .ok_or_else(|| AppError::not_found("the job's kernel source is missing"))?;
    let planned = suite_cases(&b.report, &src.manifest);
    let suites = st.config.accepted_suites();
    let expected = Expected {
        digest: &job.kernel_digest,
        manifest: &src.manifest,
        shapes: &job.shapes,
        suites: &suites,
        suite_cases: planned.as_deref(),
    };
    if let Err(problems) = validate(&b.report, &expected) {
        let listed: Vec<Value> = problems
            .iter()
            .map(|p| json!({"field": p.field, "detail": p.kind.to_string()}))
            .collect();
        st.store
            .audit(
                &who,
                "verification.refused",
                job.kernel_digest.as_str(),
                json!({"job_id": id, "problems": listed}),
            )
            .await?;
        let first = &problems[0];
        let more = match problems.len() {
            1 => String::new(),
            n => format!(" ({} more problems in `problems`)", n - 1),
        };
        return Err(AppError::unprocessable(format!(
            "the report is refused: {first}{more}. The hub stores only reports a GPU run can have produced for this job"
        ))
        .with("field", first.field.clone())
        .with("problems", listed));
    }
    let rederived = rederive(&mut b.report);
    if !rederived.is_empty() {
        tracing::warn!(job = id, fields = ?rederived, "posted summary differed from its cases; stored the derived one");
    }
    if let Some(a) = job.arch.filter(|a| *a != b.report.device.arch) {
        return Err(AppError::unprocessable(format!(
            "job {id} verifies the kernel on {a}, but the report was measured on {} ({}): claim jobs with the worker's own architecture",
            b.report.device.arch, b.report.device.name
        ))
        .with("field", "report.device.arch"));
    }
    check_certificate(&st, &who, &job, &b, &rederived).await?;
    let vid = st
        .store
        .complete_job_certified(id, &holder, &b.report, b.certificate.as_ref())
        .await?;
    if !rederived.is_empty() {
        st.store
            .audit(
                &who,
                "verification.summary_rederived",
                job.kernel_digest.as_str(),
                json!({"job_id": id, "verification_id": vid, "fields": rederived}),
            )
            .await?;
    }
    // A job with a shape list whose report has no case that ran at a requested width: the
    // report still stands as evidence, and the answer says what it lacks.
    let covered: Vec<u64> = coverage(&b.report).iter().map(|c| c.cols).collect();
    let not_covered: Vec<String> = job
        .shapes
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
        Json(ReportResponse {
            verification_id: vid,
            url: format!("/v1/verifications/{vid}"),
            class: b.report.summary.overall.class,
            shapes_not_covered: not_covered,
            summary_rederived: rederived,
        }),
    )
        .into_response())
}

/// Give up on a claimed job with a reason; it is queued again while attempts remain.
#[utoipa::path(post, path = "/v1/jobs/{id}/fail", tag = "jobs", params(("id" = i64, Path, minimum = 1)), request_body = FailRequest,
    responses((status = 200, description = "Re-queued or failed"), (status = 403, description = "Another token claimed the job"), (status = 404, description = "No such job"),
        (status = 409, description = "Lease expired or lost")),
    security(("token" = [])))]
pub async fn fail(
    State(st): State<AppState>,
    caller: Caller,
    Path(id): Path<i64>,
    b: Result<Json<FailRequest>, JsonRejection>,
) -> Result<Json<JobView>, AppError> {
    let who = caller.require(Scope::Worker)?;
    let b = body(b)?;
    let holder = Holder {
        lease_id: &b.lease_id,
        token_id: caller.token_id,
        actor: who,
    };
    let job = st.store.fail_job(id, &holder, &b.reason).await?;
    Ok(Json(job.into()))
}

/// One verification record with its full report.
#[utoipa::path(get, path = "/v1/verifications/{id}", tag = "verifications", params(("id" = i64, Path, minimum = 1)),
    responses((status = 200, description = "The verification: `verified_at` is when the GPU measured it (its report's `started_at`), `imported_at` when this hub imported it (null: this hub's worker measured it), `created_at` when it was stored", body = super::openapi::VerificationRecord), (status = 404, description = "No such verification")))]
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
        crate::stale::Staleness::new(&st.store).json(&v).await?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernel_registry::report::KNOWN_SUITES;

    #[test]
    fn the_verifiers_suite_is_the_newest_the_hub_knows() {
        assert_eq!(
            KNOWN_SUITES.last(),
            Some(&verifier::cases::SUITE_VERSION),
            "a new suite version goes at the end of kernel_registry::report::KNOWN_SUITES"
        );
    }

    /// The H200 run of 2026-11-23 (suite 2026.3, 295 cases): the hub redraws exactly its case
    /// list from its seed, and the whole check passes; one case fewer does not.
    #[test]
    fn a_real_report_matches_the_suite_the_hub_redraws() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let json = std::fs::read_to_string(
            root.join("docs/gpu-runs/2026-11-23-hardening/reports/full-kernel-rms_norm_llama.json"),
        )
        .unwrap();
        let report: VerificationReport = serde_json::from_str(&json).unwrap();
        let toml =
            std::fs::read_to_string(root.join("kernels/rms_norm_llama/kernel.toml")).unwrap();
        let mut manifest = Manifest::parse(&toml).unwrap();
        // The recorded run verified the kernel at 1.0.0; the bundled manifest has since moved
        // to 1.0.1 (op, semantics and dtypes unchanged).
        manifest.version = semver::Version::new(1, 0, 0);
        let planned = suite_cases(&report, &manifest).expect("the current suite is redrawn");
        assert_eq!(planned.len(), report.cases.len());
        let want = Expected {
            digest: &report.kernel.digest,
            manifest: &manifest,
            shapes: &[],
            suites: &[verifier::cases::SUITE_VERSION],
            suite_cases: Some(&planned),
        };
        assert_eq!(validate(&report, &want), Ok(()));
        let mut short = report.clone();
        short.cases.retain(|c| !c.id.ends_with("/large_index"));
        let e = validate(&short, &want).unwrap_err();
        assert!(
            e[0].to_string().contains("1 of the 295 cases")
                && e[0].to_string().contains("large_index"),
            "{e:#?}"
        );
    }
}
