//! Kernels: list, show, download sources, and submit new ones.

use super::openapi::{
    ArchName, DTypeName, DigestText, KernelName, KernelVersion, OpName, PolicyText, SemanticsName,
};
use super::{known_params, param};
use crate::error::{rejection, AppError};
use crate::protocol::{SubmitResponse, SubmittedJob};
use crate::state::{AppState, Caller, Scope};
use axum::extract::{FromRequest, Multipart, Path, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use kernel_registry::{Arch, DType, Digest, KernelBundle, Policy, Runtime};
use kernel_store::{Inserted, KernelQuery, KernelRow};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;

const MAX_PAGE: i64 = 500;

fn kernel_json(k: &KernelRow) -> Value {
    let mut v = serde_json::to_value(k).expect("kernel serialises");
    v["source_url"] = json!(format!("/v1/sources/{}", k.digest));
    v["url"] = json!(format!("/v1/kernels/{}/{}", k.name, k.version));
    v
}

/// List kernels, filtered by op, semantics, dtype and arch; with `policy`, only kernels whose
/// newest verification (on `arch`, if given) meets it for `dtype` (or for one of its dtypes).
#[utoipa::path(get, path = "/v1/kernels", tag = "kernels",
    params(
        ("op" = Option<OpName>, Query, description = "filter by op"),
        ("semantics" = Option<SemanticsName>, Query, description = "filter by semantics"),
        ("dtype" = Option<DTypeName>, Query, description = "filter by supported dtype"),
        ("arch" = Option<ArchName>, Query, description = "filter by declared arch (kernels declaring none match any)"),
        ("policy" = Option<PolicyText>, Query, description = "only approved kernels: verified and meeting this policy"),
        ("stale" = Option<bool>, Query, description = "with `arch`: only kernels whose newest verdict there is stale (an older suite or another driver than the newest seen there), or that were verified elsewhere but never there; each lists its reasons in `stale`"),
        ("limit" = Option<i64>, Query, description = "page size, default 50", minimum = 1, maximum = 500),
        ("offset" = Option<i64>, Query, description = "items to skip, default 0", minimum = 0, maximum = 2147483647),
    ),
    responses((status = 200, description = "A page of kernels"), (status = 400, description = "A bad filter, an unknown parameter, or `limit`/`offset` out of bounds")))]
pub async fn list(
    State(st): State<AppState>,
    _c: Caller,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, AppError> {
    known_params(
        &q,
        &[
            "op",
            "semantics",
            "dtype",
            "arch",
            "policy",
            "stale",
            "limit",
            "offset",
        ],
    )?;
    let limit: i64 = param(&q, "limit")?.unwrap_or(50);
    let offset: i64 = param(&q, "offset")?.unwrap_or(0);
    if !(1..=MAX_PAGE).contains(&limit) || offset < 0 {
        return Err(AppError::bad_request(format!(
            "`limit` must be 1..={MAX_PAGE} and `offset` >= 0"
        )));
    }
    let dtype: Option<DType> = param(&q, "dtype")?;
    let arch: Option<Arch> = param(&q, "arch")?;
    let policy: Option<Policy> = param(&q, "policy")?;
    let query = KernelQuery {
        op: param(&q, "op")?,
        semantics: param(&q, "semantics")?,
        dtype,
        arch,
        limit,
        offset,
    };
    // A policy's list is kept until the store changes (`crate::answers`): its first page as
    // text, and the ids of the whole list, from which any other page is read by id.
    let cached = match &policy {
        None => None,
        Some(_) => {
            let key = crate::answers::AnswerCache::key("/v1/kernels", &q);
            let generation = st.store.answer_generation().await?;
            if let Some(a) = st.answers.get(&key, generation) {
                return Ok(crate::answers::json_response(a));
            }
            Some((key, generation))
        }
    };
    if param::<bool>(&q, "stale")?.unwrap_or(false) {
        return stale_list(&st, query, policy.is_some()).await;
    }
    let (kernels, total) = match &policy {
        None => st.store.list_kernels(&query).await?,
        // Approval is checked on the store's verdict index in memory (`Store::verdict_index`,
        // brought up to date a write at a time): the whole list's ids, kept per filter until
        // the store changes (they do not depend on the page); then a page by id.
        Some(p) => {
            let mut filters = q.clone();
            filters.remove("limit");
            filters.remove("offset");
            let key = crate::answers::AnswerCache::key("/v1/kernels#ids", &filters);
            let generation = cached.as_ref().map(|(_, g)| *g).unwrap_or_default();
            let ids = match st.approved.get(&key, generation) {
                Some(ids) => ids,
                None => {
                    let index = st.store.verdict_index(generation).await?;
                    let ids = Arc::new(index.approved_ids(&query, p));
                    st.approved.insert(key, generation, ids.clone());
                    ids
                }
            };
            let from = usize::try_from(offset).unwrap_or(usize::MAX).min(ids.len());
            let to = from.saturating_add(limit as usize).min(ids.len());
            (
                st.store.kernels_by_ids(&ids[from..to]).await?,
                ids.len() as i64,
            )
        }
    };
    let next = (offset + limit < total).then(|| offset + limit);
    let answer = json!({
        "kernels": kernels.iter().map(kernel_json).collect::<Vec<_>>(),
        "total": total,
        "limit": limit,
        "offset": offset,
        "next_offset": next,
        "policy": policy.map(|p| p.to_string()),
    });
    // Only first pages are kept as text: a new page each ask would fill the cache.
    let cached = cached.filter(|_| offset == 0);
    Ok(match cached {
        Some((key, generation)) => st.answers.put(key, generation, &answer),
        None => Json(answer).into_response(),
    })
}

/// `GET /v1/kernels?arch=A&stale=true`: kernels to verify again on `arch` (read by index; the
/// reasons are `crate::stale`'s).
async fn stale_list(
    st: &AppState,
    query: KernelQuery,
    with_policy: bool,
) -> Result<Response, AppError> {
    let Some(arch) = query.arch else {
        return Err(AppError::bad_request(
            "query parameter `stale` needs `arch`: stale on which architecture? e.g. ?arch=sm_90&stale=true",
        )
        .with("field", "arch"));
    };
    if with_policy {
        return Err(AppError::bad_request(
            "query parameters `stale` and `policy` cannot be combined: ask for one of them",
        )
        .with("field", "stale"));
    }
    let suite = verifier::cases::SUITE_VERSION;
    let driver = st.store.newest_driver(arch).await?;
    let (rows, total) = st
        .store
        .stale_on(arch, &query, suite, driver.as_deref())
        .await?;
    let mut staleness = crate::stale::Staleness::new(&st.store);
    let mut kernels = Vec::with_capacity(rows.len());
    for (k, newest) in rows {
        let why = match newest {
            Some((suite, driver, unaudited)) => {
                let mut why = staleness.of_parts(arch, &suite, &driver).await?;
                if unaudited {
                    why.push(crate::stale::NOT_AUDITED.to_string());
                }
                why
            }
            None => vec![format!("verified elsewhere, never on {arch}")],
        };
        let mut v = kernel_json(&k);
        v["stale"] = json!(why);
        kernels.push(v);
    }
    let (limit, offset) = (query.limit, query.offset);
    let next = (offset + limit < total).then(|| offset + limit);
    Ok(Json(json!({
        "kernels": kernels,
        "total": total,
        "limit": limit,
        "offset": offset,
        "next_offset": next,
        "policy": null,
        "stale_on": arch,
    }))
    .into_response())
}

async fn find(st: &AppState, name: &str, version: &str) -> Result<KernelRow, AppError> {
    st.store.kernel(name, version).await?.ok_or_else(|| {
        AppError::not_found(format!(
            "no kernel {name} {version}; list kernels with GET /v1/kernels"
        ))
    })
}

/// One kernel: its manifest, verification jobs and verifications (summaries, each with its
/// capability audit and why a default policy refuses it, if it does).
#[utoipa::path(get, path = "/v1/kernels/{name}/{version}", tag = "kernels",
    params(("name" = KernelName, Path), ("version" = KernelVersion, Path)),
    responses((status = 200, description = "The kernel: its manifest (with the `capabilities` it declares), jobs, and verifications, each with `capabilities` (the audit of its compiled code, docs/spec.md section 3b; null when not audited) and `capabilities_refused` (why a default policy refuses it); each verification's `verified_at` is when the GPU measured it (its report's `started_at`), `imported_at` when this hub imported it (null: this hub's worker measured it), `created_at` when it was stored"), (status = 404, description = "No such kernel")))]
pub async fn get_one(
    State(st): State<AppState>,
    _c: Caller,
    Path((name, version)): Path<(String, String)>,
) -> Result<Json<Value>, AppError> {
    let k = find(&st, &name, &version).await?;
    let src = st
        .store
        .source(&k.digest)
        .await?
        .ok_or_else(|| AppError::not_found("source missing"))?;
    let jobs = st.store.jobs_for_kernel(&k.digest).await?;
    let verifications: Vec<Value> = st
        .store
        .verifications_for_kernel(&k.digest)
        .await?
        .iter()
        .map(|v| {
            json!({
                "id": v.id, "url": format!("/v1/verifications/{}", v.id), "arch": v.arch,
                "device": v.device_name, "class": v.exactness_class, "created_at": v.created_at,
                // When the GPU measured it (the report's own time), and when this hub imported
                // it (null: this hub's worker measured it); `created_at` is when it was stored.
                "verified_at": v.verified_at,
                "imported_at": v.imported_at,
                "summary": v.report.summary,
                // What the compiled code can do (docs/spec.md section 3b; null: not audited),
                // and why a default policy refuses it (empty: it does not).
                "capabilities": v.report.capabilities,
                "capabilities_refused": kernel_registry::capability::refusals(
                    v.report.audit().as_deref(), &[], false),
            })
        })
        .collect();
    let mut v = kernel_json(&k);
    v["manifest"] = serde_json::to_value(&src.manifest).expect("manifest serialises");
    v["jobs"] = serde_json::to_value(&jobs).expect("jobs serialise");
    v["verifications"] = json!(verifications);
    Ok(Json(v))
}

/// Every verification of one kernel, newest first, with full reports.
#[utoipa::path(get, path = "/v1/kernels/{name}/{version}/verifications", tag = "verifications",
    params(("name" = KernelName, Path), ("version" = KernelVersion, Path)),
    responses((status = 200, description = "Verification records, newest first; each one's `verified_at` is when the GPU measured it (its report's `started_at`), `imported_at` when this hub imported it (null: this hub's worker measured it), `created_at` when it was stored", body = super::openapi::KernelVerifications), (status = 404, description = "No such kernel")))]
pub async fn verifications(
    State(st): State<AppState>,
    _c: Caller,
    Path((name, version)): Path<(String, String)>,
) -> Result<Json<Value>, AppError> {
    let k = find(&st, &name, &version).await?;
    let vs = st.store.verifications_for_kernel(&k.digest).await?;
    let mut stale = crate::stale::Staleness::new(&st.store);
    let mut out = Vec::with_capacity(vs.len());
    for v in &vs {
        out.push(stale.json(v).await?);
    }
    Ok(Json(
        json!({ "kernel": kernel_json(&k), "verifications": out }),
    ))
}

/// Queue a verification of a stored kernel on an architecture (admin): a new GPU, driver or
/// suite. A worker that declares that architecture when it claims runs the whole suite. 201
/// with the job; 200 with the pending one when a verification there is already queued.
#[utoipa::path(post, path = "/v1/kernels/{name}/{version}/verify", tag = "jobs",
    params(("name" = KernelName, Path), ("version" = KernelVersion, Path)),
    request_body = crate::protocol::VerifyRequest,
    responses((status = 201, description = "Queued"), (status = 200, description = "Already queued or running: that job"),
        (status = 401, description = "No token, or an unknown, expired or revoked one"), (status = 403, description = "Token lacks scope admin"),
        (status = 404, description = "No such kernel"),
        (status = 422, description = "The kernel does not run on that architecture")),
    security(("token" = [])))]
pub async fn verify_request(
    State(st): State<AppState>,
    caller: Caller,
    Path((name, version)): Path<(String, String)>,
    b: Result<Json<crate::protocol::VerifyRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, AppError> {
    let actor = caller.require(Scope::Admin)?.to_string();
    let Json(b) = b.map_err(rejection)?;
    let k = find(&st, &name, &version).await?;
    if !k.archs.is_empty() && !k.archs.contains(&b.arch) {
        let runs_on: Vec<String> = k.archs.iter().map(|a| a.to_string()).collect();
        return Err(AppError::unprocessable(format!(
            "{name} {version} runs on {} only (its kernel.toml's constraints); it cannot be verified on {}",
            runs_on.join(", "),
            b.arch
        ))
        .with("field", "arch"));
    }
    let why = b.reason.as_deref().unwrap_or("requested");
    let (job, new) = st
        .store
        .queue_arch_job(&k.digest, b.arch, &actor, why)
        .await?;
    let status = if new {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((
        status,
        Json(json!({"job": job, "job_url": format!("/v1/jobs/{}", job.id)})),
    )
        .into_response())
}

/// A kernel's manifest and CUDA source by content digest (re-checked on read).
/// `Accept: text/plain` returns the source alone.
#[utoipa::path(get, path = "/v1/sources/{digest}", tag = "kernels",
    params(("digest" = DigestText, Path, description = "sha256:<hex> or the hex alone")),
    responses((status = 200, description = "manifest_toml and source (`Accept: text/plain`: the source alone)",
            content((Object = "application/json"), (String = "text/plain"))),
        (status = 400, description = "Not a digest"), (status = 404, description = "Unknown digest")))]
pub async fn source(
    State(st): State<AppState>,
    _c: Caller,
    headers: axum::http::HeaderMap,
    Path(digest): Path<String>,
) -> Result<Response, AppError> {
    let digest: Digest = digest
        .parse()
        .map_err(|e| AppError::bad_request(format!("{e}")))?;
    let src = st
        .store
        .source(&digest)
        .await?
        .ok_or_else(|| AppError::not_found(format!("no kernel source with digest {digest}")))?;
    let wants_text = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/plain"));
    if wants_text {
        return Ok((
            [
                (
                    header::CONTENT_TYPE,
                    "text/plain; charset=utf-8".to_string(),
                ),
                (header::ETAG, format!("\"{digest}\"")),
            ],
            src.source,
        )
            .into_response());
    }
    Ok((
        [(header::ETAG, format!("\"{digest}\""))],
        Json(json!({
            "digest": digest,
            "manifest_toml": src.manifest_toml,
            "manifest": src.manifest,
            "source": src.source,
        })),
    )
        .into_response())
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitBody {
    /// The kernel.toml text.
    pub manifest: String,
    /// The CUDA source text.
    pub source: String,
}

/// Submit a kernel (token scope `submit`; `submit-python` for a Python candidate): JSON `{manifest, source}` or multipart with parts
/// `manifest` and `source`. 201 with the digest and its verification job; 200 when exactly
/// this content is already stored; 409 when the name and version hold other content.
#[utoipa::path(post, path = "/v1/kernels", tag = "kernels",
    request_body(content((SubmitBody = "application/json"), (SubmitBody = "multipart/form-data")),
        description = "The kernel.toml text and the source (.cu, or .py for runtime = \"python\"), as JSON or as multipart parts `manifest` and `source` (UTF-8, no NUL; the source at most 1 MiB)"),
    responses((status = 201, description = "Stored; verification queued"), (status = 200, description = "Already stored"),
        (status = 401, description = "No token"), (status = 403, description = "Token lacks scope submit (submit-python for a Python candidate)"),
        (status = 409, description = "Same name and version, other content"), (status = 413, description = "Body too large"),
        (status = 422, description = "The manifest or source is invalid; `field` names the field")),
    security(("token" = [])))]
pub async fn submit(
    State(st): State<AppState>,
    caller: Caller,
    req: Request,
) -> Result<Response, AppError> {
    // Either submit scope lets the body be read; which one the kernel needs is known once its
    // manifest is parsed.
    let actor = match caller.require(Scope::Submit) {
        Ok(a) => a.to_string(),
        Err(e) => match caller.require(Scope::SubmitPython) {
            Ok(a) => a.to_string(),
            Err(_) => return Err(e),
        },
    };
    let is_multipart = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("multipart/form-data"));
    let body = if is_multipart {
        let mut mp = Multipart::from_request(req, &st).await.map_err(rejection)?;
        let (mut manifest, mut source) = (None, None);
        while let Some(field) = mp.next_field().await.map_err(rejection)? {
            let name = field.name().unwrap_or("").to_string();
            let text = field.text().await.map_err(rejection)?;
            match name.as_str() {
                "manifest" => manifest = Some(text),
                "source" => source = Some(text),
                other => {
                    return Err(AppError::unprocessable(format!(
                        "unknown multipart part `{other}`; send `manifest` (kernel.toml) and `source` (.cu)"
                    )))
                }
            }
        }
        SubmitBody {
            manifest: manifest.ok_or_else(|| {
                AppError::unprocessable("the `manifest` part (kernel.toml) is missing")
                    .with("field", "manifest")
            })?,
            source: source.ok_or_else(|| {
                AppError::unprocessable("the `source` part (the .cu file) is missing")
                    .with("field", "source")
            })?,
        }
    } else {
        Json::<SubmitBody>::from_request(req, &st)
            .await
            .map_err(rejection)?
            .0
    };
    let bundle = KernelBundle::from_parts(&body.manifest, &body.source)?;
    match bundle.manifest.runtime {
        // A Python candidate runs arbitrary code on the workers: only `submit-python`.
        Runtime::Python => {
            caller.require(Scope::SubmitPython).map_err(|mut e| {
                e.detail.push_str(
                    " (a kernel with runtime = \"python\" runs arbitrary code on the verifying workers; an admin grants `submit-python` with `kernelize token create --scope submit-python`)",
                );
                e.with("field", "runtime")
            })?;
        }
        Runtime::Cuda => {
            caller.require(Scope::Submit)?;
        }
    }
    let inserted = st.store.insert_kernel(&bundle, "submitted", &actor).await?;
    let (status, job_id) = match &inserted {
        Inserted::New { job_id, .. } => (StatusCode::CREATED, Some(*job_id)),
        Inserted::Existing(_) => (StatusCode::OK, None),
    };
    let k = inserted.kernel();
    tracing::info!(name = %k.name, version = %k.version, digest = %k.digest, actor = %actor, created = (status == StatusCode::CREATED), job_id, "kernel submitted");
    let jobs = st.store.jobs_for_kernel(&k.digest).await?;
    let job = job_id
        .and_then(|id| jobs.iter().find(|j| j.id == id))
        .or_else(|| jobs.last());
    Ok((
        status,
        Json(SubmitResponse {
            created: status == StatusCode::CREATED,
            digest: k.digest.clone(),
            kernel: kernel_json(k),
            job: job.map(|j| SubmittedJob {
                id: j.id,
                state: j.state,
                url: format!("/v1/jobs/{}", j.id),
            }),
        }),
    )
        .into_response())
}
