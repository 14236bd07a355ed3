//! End-to-end tests: the real `kernelize` binary serving on an ephemeral port, driven over
//! HTTP, on SQLite and on PostgreSQL.

mod support;

use reqwest::StatusCode;
use serde_json::{json, Value};
use support::{bundle_files, detail, kernels_dir, Backend, TestServer};

// Reports recorded by `kernelize verify --dtype bf16 --json` on an NVIDIA H200 (2026-11-21,
// see tests/fixtures/reports/README.md): what a real worker posts, re-targeted at each job.
/// silu_and_mul: bit-exact, 3223 GB/s at bf16 4096x8192.
const EXACT: &str = "recorded/silu_and_mul";
/// silu_and_mul_fused (single rounding): 1 ulp off on 31% of elements, 3327 GB/s.
const ONE_ULP_FASTER: &str = "recorded/silu_and_mul_fused";
/// silu_fastmath: bit-exact in bf16, 3564 GB/s.
const EXACT_FASTEST: &str = "recorded/silu_fastmath";
/// silu, verified by a real worker with `--model` (quick suite, bf16/f16/f32): bit-exact, and
/// inside the shipped tiny-llama the argmax held at every token.
const EXACT_WITH_MODEL: &str = "recorded/with_model/silu";

both_backends!(
    lists_the_bundled_kernels,
    sources_come_back_digest_checked,
    immutability_over_http,
    bad_input_gets_a_problem_naming_it,
    acknowledged_writes_survive_sigkill,
    submit_claim_report_resolve,
    resolve_answers_say_when_and_at_what_shape,
    imported_certificates_say_when_the_gpu_measured,
    policy_gating_and_arch,
    argmax_policy_needs_a_model_measurement_unless_bit_exact,
    leases_expire_and_no_job_completes_twice,
    an_expired_lease_is_refused_though_nobody_claimed_again,
    many_submissions_with_four_workers,
    openapi_covers_every_route,
    submit_cli_waits_and_gates_on_policy,
    shape_exact_resolve_queues_and_runs_a_width_job,
    width_jobs_are_capped,
    serve_worker_keeps_one_token_across_restarts,
    token_ensure_hands_a_worker_one_token_file,
    request_ids_flow_into_logs_and_back,
    another_workers_token_cannot_use_a_lease,
    forged_reports_are_refused,
    a_hub_accepts_its_own_suite_by_default,
    tokens_expire_list_and_revoke_over_the_cli_and_the_api,
    a_database_from_before_claim_tokens_is_served_after_its_upgrade,
);

async fn lists_the_bundled_kernels(b: Backend) {
    let srv = TestServer::start(&b, &[]).await;
    let expected = std::fs::read_dir(kernels_dir())
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().join("kernel.toml").is_file())
        .count() as u64;
    assert!(
        expected >= 7,
        "at least one bundled kernel per op, found {expected}"
    );
    let all: Value = srv.get_json("/v1/kernels?limit=500").await;
    assert_eq!(all["total"].as_u64(), Some(expected));
    let ops: std::collections::BTreeSet<String> = all["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["op"].as_str().unwrap().to_string())
        .collect();
    for op in [
        "rms_norm",
        "fused_add_rms_norm",
        "layer_norm",
        "silu",
        "silu_and_mul",
        "gelu",
        "gelu_tanh",
    ] {
        assert!(ops.contains(op), "no bundled {op} kernel");
    }
    // Paging walks the whole list once.
    let mut seen = Vec::new();
    let mut offset = 0;
    loop {
        let page: Value = srv
            .get_json(&format!("/v1/kernels?limit=3&offset={offset}"))
            .await;
        for k in page["kernels"].as_array().unwrap() {
            seen.push(k["digest"].as_str().unwrap().to_string());
        }
        match page["next_offset"].as_u64() {
            Some(n) => offset = n,
            None => break,
        }
    }
    let n = seen.len();
    seen.sort();
    seen.dedup();
    assert_eq!((n as u64, seen.len() as u64), (expected, expected));
    // Filters.
    let rms: Value = srv
        .get_json("/v1/kernels?op=rms_norm&dtype=bf16&arch=sm_90")
        .await;
    assert!(rms["total"].as_u64().unwrap() >= 1);
    assert!(rms["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .all(|k| k["op"] == "rms_norm"));
    let first = &all["kernels"][0];
    let one: Value = srv
        .get_json(&format!(
            "/v1/kernels/{}/{}",
            first["name"].as_str().unwrap(),
            first["version"].as_str().unwrap()
        ))
        .await;
    assert_eq!(one["digest"], first["digest"]);
    assert!(one["manifest"]["entries"].is_object());
    // A bundled kernel has a suite job queued unless a bundled certificate covers it (then none:
    // issue 27 item 4, tests/certs.rs).
    let imported = support::has_imported_verification(
        &srv,
        first["name"].as_str().unwrap(),
        first["version"].as_str().unwrap(),
    )
    .await;
    if imported {
        assert_eq!(one["jobs"], json!([]), "covered by a certificate: no job");
    } else {
        assert_eq!(
            one["jobs"][0]["state"], "queued",
            "a bundled kernel is queued for verification"
        );
    }
    // Restarting on the same database loads nothing twice.
    let url = srv.db_url.clone();
    drop(srv);
    let again = TestServer::start_on(&b, &url, &[]).await;
    let all2: Value = again.get_json("/v1/kernels?limit=500").await;
    assert_eq!(all2["total"].as_u64(), Some(expected));
}

async fn sources_come_back_digest_checked(b: Backend) {
    let srv = TestServer::start(&b, &[]).await;
    let all: Value = srv.get_json("/v1/kernels?limit=500").await;
    for k in all["kernels"].as_array().unwrap() {
        let digest = k["digest"].as_str().unwrap();
        let src: Value = srv.get_json(&format!("/v1/sources/{digest}")).await;
        // Recompute the digest from what came back: the client can trust nothing else.
        let bundle = kernel_registry::KernelBundle::from_parts(
            src["manifest_toml"].as_str().unwrap(),
            src["source"].as_str().unwrap(),
        )
        .unwrap();
        assert_eq!(bundle.digest().as_str(), digest);
    }
    let (status, p) = srv.get("/v1/sources/sha256:abc").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(detail(&p).contains("64 lowercase hex"), "{p}");
    let missing = kernel_registry::Digest::of_bytes(b"nothing");
    let (status, p) = srv.get(&format!("/v1/sources/{}", missing.hex())).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{p}");
}

async fn immutability_over_http(b: Backend) {
    let srv = TestServer::start(&b, &[]).await;
    let token = srv.token("submit");
    let (m, s) = bundle_files("imm_test", "1.0.0", "");
    let (st, first) = srv
        .post("/v1/kernels", &token, &json!({"manifest": m, "source": s}))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{first}");
    assert!(first["job"]["id"].as_i64().is_some());
    let (st, again) = srv
        .post("/v1/kernels", &token, &json!({"manifest": m, "source": s}))
        .await;
    assert_eq!(st, StatusCode::OK, "{again}");
    assert_eq!(again["digest"], first["digest"]);
    assert_eq!(again["created"], false);
    let (_, s2) = bundle_files("imm_test", "1.0.0", "/* other */");
    let (st, p) = srv
        .post("/v1/kernels", &token, &json!({"manifest": m, "source": s2}))
        .await;
    assert_eq!(st, StatusCode::CONFLICT, "{p}");
    assert!(detail(&p).contains("publish a new version"), "{p}");
    // Multipart works the same.
    let (m3, s3) = bundle_files("imm_multipart", "1.0.0", "");
    let form = reqwest::multipart::Form::new()
        .text("manifest", m3)
        .text("source", s3);
    let r = srv
        .client
        .post(srv.url("/v1/kernels"))
        .bearer_auth(&token)
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
}

async fn bad_input_gets_a_problem_naming_it(b: Backend) {
    let srv = TestServer::start(&b, &[]).await;
    let submit = srv.token("submit");
    let worker = srv.token("worker");
    let (m, s) = bundle_files("bad_input", "1.0.0", "");
    let big = "x".repeat((2 << 20) + 4096);
    let cases: Vec<(&str, Option<&str>, Value, StatusCode, &str)> = vec![
        (
            "malformed TOML",
            Some(&submit),
            json!({"manifest": "name = [", "source": s}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "line 1",
        ),
        (
            "unknown op",
            Some(&submit),
            json!({"manifest": m.replace("op = \"silu\"", "op = \"softmax\""), "source": s}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "`op`",
        ),
        (
            "missing source",
            Some(&submit),
            json!({"manifest": m}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "source",
        ),
        (
            "empty source",
            Some(&submit),
            json!({"manifest": m, "source": ""}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "empty",
        ),
        (
            "symbol not in source",
            Some(&submit),
            json!({"manifest": m, "source": "int x;"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "entry.bf16",
        ),
        (
            "oversized body",
            Some(&submit),
            json!({"manifest": m, "source": big}),
            StatusCode::PAYLOAD_TOO_LARGE,
            "larger than",
        ),
        (
            "no token",
            None,
            json!({"manifest": m, "source": s}),
            StatusCode::UNAUTHORIZED,
            "token create",
        ),
        (
            "bad token",
            Some("kz_not_a_token"),
            json!({"manifest": m, "source": s}),
            StatusCode::UNAUTHORIZED,
            "not valid",
        ),
        (
            "wrong scope",
            Some(&worker),
            json!({"manifest": m, "source": s}),
            StatusCode::FORBIDDEN,
            "needs `submit`",
        ),
    ];
    for (what, token, body, want, says) in cases {
        let (st, p, ctype) = srv.post_raw("/v1/kernels", token, &body).await;
        assert_eq!(st, want, "{what}: {p}");
        assert_eq!(ctype, "application/problem+json", "{what}");
        let d = detail(&p);
        assert!(d.contains(says), "{what}: detail `{d}` lacks `{says}`");
    }
    let gets = [
        (
            "/v1/kernels?op=softmax",
            StatusCode::BAD_REQUEST,
            "query parameter `op`",
        ),
        (
            "/v1/kernels?dtype=fp8",
            StatusCode::BAD_REQUEST,
            "query parameter `dtype`",
        ),
        (
            "/v1/kernels?colour=red",
            StatusCode::BAD_REQUEST,
            "unknown query parameter `colour`",
        ),
        ("/v1/kernels?policy=exact", StatusCode::BAD_REQUEST, "ulp:N"),
        (
            "/v1/resolve?op=rms_norm&dtype=bf16&arch=sm_90&cols=4096&policy=ulp:x",
            StatusCode::BAD_REQUEST,
            "whole number",
        ),
        (
            "/v1/resolve?op=rms_norm&dtype=bf16&arch=sm_90",
            StatusCode::BAD_REQUEST,
            "`cols` is required",
        ),
        (
            "/v1/resolve?op=silu&semantics=llama&dtype=bf16&arch=sm_90&cols=8",
            StatusCode::BAD_REQUEST,
            "for op silu",
        ),
        (
            "/v1/resolve?op=rms_norm&dtype=bf16&arch=hopper&cols=8",
            StatusCode::BAD_REQUEST,
            "sm_",
        ),
        ("/v1/sources/zz", StatusCode::BAD_REQUEST, "digest"),
        (
            "/v1/kernels/none/1.0.0",
            StatusCode::NOT_FOUND,
            "no kernel none 1.0.0",
        ),
        (
            "/v1/verifications/999999",
            StatusCode::NOT_FOUND,
            "no verification",
        ),
        (
            "/v1/jobs/999999",
            StatusCode::NOT_FOUND,
            "no verification job",
        ),
        ("/v2/nothing", StatusCode::NOT_FOUND, "openapi"),
    ];
    for (path, want, says) in gets {
        let (st, p) = srv.get(path).await;
        assert_eq!(st, want, "{path}: {p}");
        assert!(detail(&p).contains(says), "{path}: {p}");
    }
}

async fn acknowledged_writes_survive_sigkill(b: Backend) {
    let mut srv = TestServer::start(&b, &["--no-bundled"]).await;
    let token = srv.token("submit");
    let mut digests = Vec::new();
    for i in 0..20 {
        let (m, s) = bundle_files(&format!("durable_{i}"), "1.0.0", "");
        let (st, r) = srv
            .post("/v1/kernels", &token, &json!({"manifest": m, "source": s}))
            .await;
        assert_eq!(st, StatusCode::CREATED, "{r}");
        digests.push(r["digest"].as_str().unwrap().to_string());
    }
    // Acknowledged; now the process dies without any chance to flush.
    srv.sigkill();
    let url = srv.db_url.clone();
    let again = TestServer::start_on(&b, &url, &["--no-bundled"]).await;
    for d in &digests {
        let (st, p) = again.get(&format!("/v1/sources/{d}")).await;
        assert_eq!(st, StatusCode::OK, "acknowledged kernel {d} lost: {p}");
    }
    let all: Value = again.get_json("/v1/kernels?limit=500").await;
    assert_eq!(all["total"].as_u64(), Some(digests.len() as u64));
}

/// Claim the next job and post a recorded verifier report (re-targeted at the job's kernel).
async fn verify_next(
    srv: &TestServer,
    worker: &str,
    report_fixture: &str,
    arch: &str,
) -> (i64, Value) {
    support::claim_and_report(srv, worker, |claim| {
        support::recorded_report(report_fixture, claim, arch)
    })
    .await
}

async fn submit_claim_report_resolve(b: Backend) {
    let srv = TestServer::start(&b, &["--no-bundled"]).await;
    let submit = srv.token("submit");
    let worker = srv.token("worker");
    let (m, s) = bundle_files("e2e_exact", "1.0.0", "");
    let (st, sub) = srv
        .post("/v1/kernels", &submit, &json!({"manifest": m, "source": s}))
        .await;
    assert_eq!(st, StatusCode::CREATED);
    // Not verified yet: never handed out.
    let q = "/v1/resolve?op=silu&dtype=bf16&arch=sm_90&cols=4096&rows=4096&policy=bit_exact";
    let (st, p) = srv.get(q).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{p}");
    assert!(
        p["excluded"][0]
            .as_str()
            .unwrap()
            .contains("never verified"),
        "{p}"
    );

    let (job, rec) = verify_next(&srv, &worker, EXACT, "sm_90").await;
    assert_eq!(sub["job"]["id"].as_i64(), Some(job));
    assert_eq!(rec["class"], "bit_exact");
    let j: Value = srv.get_json(&format!("/v1/jobs/{job}")).await;
    assert_eq!(j["state"], "done");

    let (st, r) = srv.get(q).await;
    assert_eq!(st, StatusCode::OK, "{r}");
    assert_eq!(r["kernel"]["name"], "e2e_exact");
    assert_eq!(r["digest"], sub["digest"]);
    assert_eq!(r["class"], "bit_exact");
    assert!(r["speed"]["gbps"].as_f64().unwrap() > 0.0);
    let v: Value = srv.get_json(r["verification_url"].as_str().unwrap()).await;
    assert_eq!(v["report"]["kernel"]["digest"], sub["digest"]);
    // Measured by this hub's worker: the time is the report's own, nothing was imported.
    assert_eq!(r["verified_at"], v["report"]["started_at"], "{r}");
    assert_eq!(r["imported_at"], Value::Null, "{r}");
    assert_fits_resolve_schema(&srv, &r).await;
    let one: Value = srv.get_json("/v1/kernels/e2e_exact/1.0.0").await;
    assert_eq!(
        one["verifications"][0]["verified_at"],
        v["report"]["started_at"]
    );
    assert_eq!(one["verifications"][0]["imported_at"], Value::Null);
    // An elementwise op: the speed says the shape it was measured at and whether that is the
    // asked element count.
    let sp = &r["speed"];
    let (rows, cols) = (sp["rows"].as_u64().unwrap(), sp["cols"].as_u64().unwrap());
    assert_eq!(
        sp["measured_at"],
        json!({"rows": rows, "cols": cols}),
        "{r}"
    );
    assert_eq!(
        sp["asked_width_measured"],
        json!(rows * cols == 4096),
        "{r}"
    );
    assert_eq!(sp["note"].is_string(), rows * cols != 4096, "{r}");
    assert_eq!(r["semantics"], "default");
    assert_eq!(r["semantics_defaulted"], true);
    let vs: Value = srv
        .get_json("/v1/kernels/e2e_exact/1.0.0/verifications")
        .await;
    assert_eq!(vs["verifications"].as_array().unwrap().len(), 1);
    // The rows name the times as the resolve answer does: measured by this hub's worker.
    let row = &vs["verifications"][0];
    assert_eq!(row["verified_at"], v["report"]["started_at"], "{row}");
    assert_eq!(row["imported_at"], Value::Null, "{row}");
    assert_eq!(row["created_at"], v["created_at"], "{row}");
    assert_eq!(v["verified_at"], row["verified_at"], "{v}");
    assert_eq!(v["imported_at"], Value::Null, "{v}");
    assert_fits_schema(
        &srv,
        "/v1/kernels/{name}/{version}/verifications",
        "KernelVerifications",
        &vs,
    )
    .await;
    assert_fits_schema(&srv, "/v1/verifications/{id}", "VerificationRecord", &v).await;
    let approved: Value = srv
        .get_json("/v1/kernels?policy=bit_exact&dtype=bf16&arch=sm_90")
        .await;
    assert_eq!(approved["total"], 1);
    let audit = support::audit_actions(&b, &srv.db_url).await;
    for a in ["kernel.created", "job.claimed", "verification.recorded"] {
        assert!(audit.iter().any(|x| x == a), "audit lacks {a}: {audit:?}");
    }
}

/// A resolve answer fits the 200 body the served OpenAPI document declares (its `ResolveAnswer`,
/// with every field it lists present), as schemathesis holds it.
async fn assert_fits_resolve_schema(srv: &TestServer, answer: &Value) {
    assert_fits_schema(srv, "/v1/resolve", "ResolveAnswer", answer).await;
}

/// A 200 answer of `GET path` (its template in the document) fits the body the served OpenAPI
/// document declares (the component `schema`), with every field the schema lists present.
async fn assert_fits_schema(srv: &TestServer, path: &str, schema: &str, answer: &Value) {
    let doc: Value = srv.get_json("/openapi.json").await;
    let body =
        &doc["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]["schema"];
    assert_eq!(
        body["$ref"],
        format!("#/components/schemas/{schema}"),
        "{body}"
    );
    let mut root = body.clone();
    root.as_object_mut()
        .unwrap()
        .insert("components".into(), doc["components"].clone());
    let validator = jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .build(&root)
        .unwrap();
    let errors: Vec<String> = validator
        .iter_errors(answer)
        .map(|e| format!("{}: {e}", e.instance_path().as_str()))
        .collect();
    assert!(errors.is_empty(), "{errors:?} in {answer}");
    for field in doc["components"]["schemas"][schema]["properties"]
        .as_object()
        .unwrap()
        .keys()
    {
        assert!(
            answer.get(field).is_some(),
            "the answer lacks `{field}`: {answer}"
        );
    }
}

/// Issue 27 items 4 and 6 on a hub with the bundled certificates: `verified_at` is when the GPU
/// measured (the report's `started_at`), `imported_at` when this hub imported the certificate;
/// the speed is labelled with the shape it was measured at; rms_norm without `semantics` names
/// the default it used, in answers and refusals.
async fn resolve_answers_say_when_and_at_what_shape(b: Backend) {
    let srv = TestServer::start(&b, &[]).await;
    let base = "/v1/resolve?op=rms_norm&dtype=bf16&arch=sm_90";
    // cols 2048 is verified, but the suite timed rms_norm at 4096x8192 and 32768x4096 only.
    let (st, r) = srv.get(&format!("{base}&cols=2048")).await;
    assert_eq!(st, StatusCode::OK, "{r}");
    assert_fits_resolve_schema(&srv, &r).await;
    assert_eq!(r["semantics"], "llama", "{r}");
    assert_eq!(r["semantics_defaulted"], true, "{r}");
    assert_eq!(r["kernel"]["semantics"], "llama", "{r}");
    let v: Value = srv.get_json(r["verification_url"].as_str().unwrap()).await;
    assert_eq!(v["job_id"], Value::Null, "a bundled certificate: {v}");
    let started = v["report"]["started_at"].as_str().unwrap();
    assert_eq!(r["verified_at"], started, "{r}");
    assert_eq!(r["imported_at"], v["created_at"], "{r}");
    assert_ne!(r["imported_at"], r["verified_at"], "{r}");
    let sp = &r["speed"];
    assert!(sp["gbps"].as_f64().unwrap() > 0.0, "{r}");
    assert_eq!(sp["asked_width_measured"], false, "{r}");
    assert_ne!(sp["measured_at"]["cols"], 2048, "{r}");
    assert_eq!(sp["measured_at"]["cols"], sp["cols"], "{r}");
    assert_eq!(sp["measured_at"]["rows"], sp["rows"], "{r}");
    assert!(
        sp["note"]
            .as_str()
            .unwrap()
            .contains("no speed was measured at the asked cols=2048"),
        "{r}"
    );
    assert!(
        sp.get("asked_rows_measured").is_none(),
        "rows not asked: {r}"
    );
    // At a timed shape the figure is the asked one.
    let (st, r) = srv
        .get(&format!("{base}&cols=4096&rows=32768&semantics=llama"))
        .await;
    assert_eq!(st, StatusCode::OK, "{r}");
    assert_fits_resolve_schema(&srv, &r).await;
    assert_eq!(r["semantics"], "llama");
    assert_eq!(r["semantics_defaulted"], false, "{r}");
    let sp = &r["speed"];
    assert_eq!(
        sp["measured_at"],
        json!({"rows": 32768, "cols": 4096}),
        "{r}"
    );
    assert_eq!(sp["asked_width_measured"], true, "{r}");
    assert_eq!(sp["asked_rows_measured"], true, "{r}");
    assert!(sp.get("note").is_none(), "{r}");
    // The kernel page says the same times.
    let k = &r["kernel"];
    let one: Value = srv
        .get_json(&format!(
            "/v1/kernels/{}/{}",
            k["name"].as_str().unwrap(),
            k["version"].as_str().unwrap()
        ))
        .await;
    let mine = one["verifications"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["id"] == r["verification_id"])
        .unwrap();
    let v: Value = srv.get_json(r["verification_url"].as_str().unwrap()).await;
    assert_eq!(mine["verified_at"], v["report"]["started_at"], "{mine}");
    assert_eq!(mine["imported_at"], v["created_at"], "{mine}");
    assert_eq!(r["verified_at"], v["report"]["started_at"], "{r}");
    // A refusal names the default too, and the choices.
    let (st, p) = srv
        .get("/v1/resolve?op=rms_norm&dtype=bf16&arch=sm_80&cols=4096")
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{p}");
    assert_eq!(p["semantics"], "llama", "{p}");
    assert_eq!(p["semantics_defaulted"], true, "{p}");
    let d = detail(&p);
    assert!(
        d.contains("`semantics` was not given: llama was used")
            && d.contains("llama, gemma, torch"),
        "{d}"
    );
    let (st, p) = srv
        .get("/v1/resolve?op=rms_norm&semantics=gemma&dtype=bf16&arch=sm_80&cols=4096")
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{p}");
    assert_eq!(p["semantics"], "gemma", "{p}");
    assert_eq!(p["semantics_defaulted"], false, "{p}");
    assert!(
        !detail(&p).is_empty() && !detail(&p).contains("was not given"),
        "{p}"
    );
}

/// Issue 27: a bundled certificate, measured on a GPU before this hub imported it, says when
/// the GPU measured it (its report's `started_at`) and when it was imported, alike in the
/// resolve answer, the kernel's `/verifications` rows, the record, and the dashboard's matrix
/// and field pages (the measured time shown, the import time in its title, and on a second line
/// when it is another day).
async fn imported_certificates_say_when_the_gpu_measured(b: Backend) {
    let srv = TestServer::start(&b, &[]).await;
    let (st, r) = srv
        .get("/v1/resolve?op=rms_norm&semantics=llama&dtype=bf16&arch=sm_90&cols=4096")
        .await;
    assert_eq!(st, StatusCode::OK, "{r}");
    let k = &r["kernel"];
    let (name, version) = (k["name"].as_str().unwrap(), k["version"].as_str().unwrap());
    let vs: Value = srv
        .get_json(&format!("/v1/kernels/{name}/{version}/verifications"))
        .await;
    assert_fits_schema(
        &srv,
        "/v1/kernels/{name}/{version}/verifications",
        "KernelVerifications",
        &vs,
    )
    .await;
    let row = vs["verifications"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["id"] == r["verification_id"])
        .unwrap_or_else(|| panic!("verification {} not listed: {vs}", r["verification_id"]));
    assert_eq!(row["job_id"], Value::Null, "imported: {row}");
    let measured = row["report"]["started_at"].as_str().unwrap();
    let imported = row["created_at"].as_str().unwrap();
    assert!(
        measured < imported,
        "the GPU measured it before this hub imported it: {row}"
    );
    assert_eq!(row["verified_at"], measured, "{row}");
    assert_eq!(row["imported_at"], imported, "{row}");
    assert_eq!(r["verified_at"], measured, "{r}");
    assert_eq!(r["imported_at"], imported, "{r}");
    let v: Value = srv.get_json(r["verification_url"].as_str().unwrap()).await;
    assert_fits_schema(&srv, "/v1/verifications/{id}", "VerificationRecord", &v).await;
    assert_eq!(
        (&v["verified_at"], &v["imported_at"]),
        (&row["verified_at"], &row["imported_at"]),
        "{v}"
    );
    // Every row of the list says the same of itself.
    for x in vs["verifications"].as_array().unwrap() {
        assert_eq!(x["verified_at"], x["report"]["started_at"], "{x}");
        let want = if x["job_id"].is_null() {
            x["created_at"].clone()
        } else {
            Value::Null
        };
        assert_eq!(x["imported_at"], want, "{x}");
    }
    // The dashboard: the "verified" column shows the measured time, the import in its title.
    let cell = format!(
        "<time datetime=\"{measured}\" title=\"measured by the GPU {measured}; imported by this hub {imported}\"><span class=\"nw\">{}</span> {}</time>",
        &measured[..10],
        &measured[11..16]
    );
    let second = format!("imported <span class=\"nw\">{}</span>", &imported[..10]);
    for path in [
        "/?op=rms_norm&dtype=bf16&arch=sm_90&limit=500",
        "/field?op=rms_norm&dtype=bf16&arch=sm_90&limit=500",
    ] {
        let html = srv
            .client
            .get(srv.url(path))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(html.contains(name), "{path}: no {name}");
        assert!(html.contains(&cell), "{path}: no `{cell}` in {html}");
        assert_eq!(
            html.contains(&second),
            measured[..10] != imported[..10],
            "{path}: the import's day on a second line only when it is another day"
        );
    }
    // The kernel's page heads the verification with the measured time, and says the import's.
    let html = srv
        .client
        .get(srv.url(&format!("/kernels/{name}/{version}")))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for needle in [
        format!("<time datetime=\"{measured}\" title=\"measured by the GPU {measured}\">"),
        format!("stored by this hub <time datetime=\"{imported}\""),
    ] {
        assert!(html.contains(&needle), "the kernel page lacks `{needle}`");
    }
}

async fn policy_gating_and_arch(b: Backend) {
    let srv = TestServer::start(&b, &["--no-bundled"]).await;
    let submit = srv.token("submit");
    let worker = srv.token("worker");
    // Three kernels of one op: exact-but-slower, 1-ulp-off-but-faster, and exact verified only on sm_80.
    for (name, fixture, arch) in [
        ("g_exact", EXACT, "sm_90"),
        ("g_off", ONE_ULP_FASTER, "sm_90"),
        ("g_old", EXACT_FASTEST, "sm_80"),
    ] {
        let (m, s) = bundle_files(name, "1.0.0", "");
        let m = m.replace("archs = [\"sm_90\"]", "archs = []");
        let (st, _) = srv
            .post("/v1/kernels", &submit, &json!({"manifest": m, "source": s}))
            .await;
        assert_eq!(st, StatusCode::CREATED);
        verify_next(&srv, &worker, fixture, arch).await;
    }
    let q = |policy: &str| {
        format!("/v1/resolve?op=silu&dtype=bf16&arch=sm_90&cols=8192&rows=4096&policy={policy}")
    };
    let (st, r) = srv.get(&q("bit_exact")).await;
    assert_eq!(st, StatusCode::OK, "{r}");
    assert_eq!(
        r["kernel"]["name"], "g_exact",
        "the 1-ulp kernel must never resolve for bit_exact"
    );
    let excluded = r["excluded"].to_string();
    assert!(
        excluded.contains("g_off 1.0.0") && excluded.contains("fails bit_exact"),
        "{excluded}"
    );
    assert!(
        excluded.contains("g_old 1.0.0: not verified on sm_90 (only on sm_80)"),
        "{excluded}"
    );
    // Tolerance admits both; the fastest wins.
    let (_, r) = srv.get(&q("tolerance")).await;
    assert_eq!(r["kernel"]["name"], "g_off", "{r}");
    assert!(r["also_qualifying"][0]
        .as_str()
        .unwrap()
        .contains("g_exact"));
    // On sm_80 only the old one was measured.
    let (_, r) = srv
        .get("/v1/resolve?op=silu&dtype=bf16&arch=sm_80&cols=8192&policy=bit_exact")
        .await;
    assert_eq!(r["kernel"]["name"], "g_old", "{r}");
    // Nothing verified for f16: a 404 that says why for each.
    let (st, p) = srv
        .get("/v1/resolve?op=silu&dtype=f16&arch=sm_90&cols=8192&policy=tolerance")
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    assert!(detail(&p).contains("keep your reference layer"), "{p}");
    assert_eq!(p["excluded"].as_array().unwrap().len(), 3, "{p}");
    assert_eq!(p["excluded_total"], 3, "{p}");

    // Answers are kept until the store changes: a new verification changes them at once.
    let approved = "/v1/kernels?policy=bit_exact&arch=sm_90&dtype=bf16";
    let (_, l) = srv.get(approved).await;
    assert_eq!(l["total"], 1, "{l}");
    let admin = srv.token("admin");
    let (st, j) = srv
        .post(
            "/v1/kernels/g_old/1.0.0/verify",
            &admin,
            &json!({"arch": "sm_90"}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{j}");
    verify_next(&srv, &worker, EXACT_FASTEST, "sm_90").await;
    let (st, r) = srv.get(&q("bit_exact")).await;
    assert_eq!(st, StatusCode::OK, "{r}");
    assert_eq!(
        r["kernel"]["name"], "g_old",
        "the newer verdict answers: {r}"
    );
    let (_, l) = srv.get(approved).await;
    assert_eq!(l["total"], 2, "{l}");
}

async fn argmax_policy_needs_a_model_measurement_unless_bit_exact(b: Backend) {
    let srv = TestServer::start(&b, &["--no-bundled"]).await;
    let submit = srv.token("submit");
    let worker = srv.token("worker");
    // Bit-exact and fastest, measured per layer only; 1 ulp off, measured per layer only; and
    // slower with its argmax measured in a model.
    for (name, fixture) in [
        ("m_layer_only", EXACT_FASTEST),
        ("m_off", ONE_ULP_FASTER),
        ("m_in_model", EXACT_WITH_MODEL),
    ] {
        // The model-level report ran bf16, f16 and f32: the kernel has the three entries.
        let (m, s) = bundle_files(name, "1.0.0", "");
        let m = m.replace(
            "bf16 = \"k_bf16\"\n",
            "bf16 = \"k_bf16\"\nf16 = \"k_f16\"\nf32 = \"k_f32\"\n",
        );
        let s = format!(
            "{s}extern \"C\" __global__ void k_f16() {{}}\nextern \"C\" __global__ void k_f32() {{}}\n"
        );
        let (st, _) = srv
            .post("/v1/kernels", &submit, &json!({"manifest": m, "source": s}))
            .await;
        assert_eq!(st, StatusCode::CREATED);
        verify_next(&srv, &worker, fixture, "sm_90").await;
    }
    let (st, r) = srv
        .get("/v1/resolve?op=silu&dtype=bf16&arch=sm_90&cols=8192&policy=argmax")
        .await;
    assert_eq!(st, StatusCode::OK, "{r}");
    // A bit-exact kernel changes no output, so no argmax: it needs no model-level measurement
    // (argmax, the weaker policy, hands out what bit_exact hands out: the faster one).
    assert_eq!(r["kernel"]["name"], "m_layer_only", "{r}");
    assert!(
        r["also_qualifying"].to_string().contains("m_in_model"),
        "{r}"
    );
    let excluded = r["excluded"].to_string();
    assert!(
        excluded.contains("m_off 1.0.0")
            && excluded.contains("no model-level (argmax) measurement for bf16, and not bit-exact"),
        "{excluded}"
    );
    let (_, r) = srv
        .get("/v1/resolve?op=silu&dtype=bf16&arch=sm_90&cols=8192&policy=bit_exact")
        .await;
    assert_eq!(r["kernel"]["name"], "m_layer_only", "{r}");
    // The model-level figures are served with the verification.
    let (st, v) = srv.get("/v1/kernels/m_in_model/1.0.0/verifications").await;
    assert_eq!(st, StatusCode::OK);
    let model = &v["verifications"][0]["report"]["model"];
    assert_eq!(model.as_array().map(Vec::len), Some(3), "{model}");
    assert_eq!(model[0]["model_name"], "tiny-llama");
    assert_eq!(model[0]["argmax_match_fraction"], 1.0);
}

async fn leases_expire_and_no_job_completes_twice(b: Backend) {
    let srv = TestServer::start(&b, &["--no-bundled", "--lease-seconds", "1"]).await;
    let submit = srv.token("submit");
    let worker = srv.token("worker");
    let (m, s) = bundle_files("lease_k", "1.0.0", "");
    srv.post("/v1/kernels", &submit, &json!({"manifest": m, "source": s}))
        .await;
    let (_, a) = srv
        .post("/v1/jobs/claim", &worker, &json!({"worker": "a"}))
        .await;
    let (st, _) = srv
        .post("/v1/jobs/claim", &worker, &json!({"worker": "b"}))
        .await;
    assert_eq!(
        st,
        StatusCode::NO_CONTENT,
        "a leased job was handed out twice"
    );
    let job = a["job"]["id"].as_i64().unwrap();
    let (st, _) = srv
        .post(
            &format!("/v1/jobs/{job}/heartbeat"),
            &worker,
            &json!({"lease_id": a["lease_id"]}),
        )
        .await;
    assert_eq!(st, StatusCode::OK);
    // Worker a goes silent; b takes the job over.
    tokio::time::sleep(std::time::Duration::from_millis(1300)).await;
    let (st, bb) = srv
        .post("/v1/jobs/claim", &worker, &json!({"worker": "b"}))
        .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(bb["job"]["id"].as_i64(), Some(job));
    assert_eq!(bb["job"]["attempts"], 2);
    let (st, p) = srv
        .post(
            &format!("/v1/jobs/{job}/heartbeat"),
            &worker,
            &json!({"lease_id": a["lease_id"]}),
        )
        .await;
    assert_eq!(st, StatusCode::CONFLICT, "{p}");
    let report_a = support::recorded_report(EXACT, &a, "sm_90");
    let (st, _) = srv
        .post(
            &format!("/v1/jobs/{job}/report"),
            &worker,
            &json!({"lease_id": a["lease_id"], "report": report_a}),
        )
        .await;
    assert_eq!(
        st,
        StatusCode::CONFLICT,
        "the lost lease's report must be refused"
    );
    let report_b = support::recorded_report(EXACT, &bb, "sm_90");
    let body = json!({"lease_id": bb["lease_id"], "report": report_b});
    let (st, _) = srv
        .post(&format!("/v1/jobs/{job}/report"), &worker, &body)
        .await;
    assert_eq!(st, StatusCode::CREATED);
    let (st, p) = srv
        .post(&format!("/v1/jobs/{job}/report"), &worker, &body)
        .await;
    assert_eq!(st, StatusCode::CONFLICT, "{p}");
    assert!(detail(&p).contains("already complete"));
    // A report for another kernel is refused.
    let (m2, s2) = bundle_files("lease_k2", "1.0.0", "");
    srv.post(
        "/v1/kernels",
        &submit,
        &json!({"manifest": m2, "source": s2}),
    )
    .await;
    let (_, c) = srv
        .post("/v1/jobs/claim", &worker, &json!({"worker": "c"}))
        .await;
    let wrong = support::recorded_report(EXACT, &bb, "sm_90");
    let job2 = c["job"]["id"].as_i64().unwrap();
    let (st, p) = srv
        .post(
            &format!("/v1/jobs/{job2}/report"),
            &worker,
            &json!({"lease_id": c["lease_id"], "report": wrong}),
        )
        .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{p}");
}

/// Issue 26: a lease that expired is refused for heartbeat, report and fail (409, saying so),
/// though no other worker claimed the job again; the job is left running on it for the next
/// claim, which gets a new lease and a new nonce.
async fn an_expired_lease_is_refused_though_nobody_claimed_again(b: Backend) {
    let srv = TestServer::start(&b, &["--no-bundled", "--lease-seconds", "1"]).await;
    let submit = srv.token("submit");
    let worker = srv.token("worker");
    let (m, s) = bundle_files("expired_k", "1.0.0", "");
    srv.post("/v1/kernels", &submit, &json!({"manifest": m, "source": s}))
        .await;
    let (st, a) = srv
        .post("/v1/jobs/claim", &worker, &json!({"worker": "a"}))
        .await;
    assert_eq!(st, StatusCode::OK, "{a}");
    let job = a["job"]["id"].as_i64().unwrap();
    let report = support::recorded_report(EXACT, &a, "sm_90");
    tokio::time::sleep(std::time::Duration::from_millis(1300)).await;
    for (route, body) in [
        ("heartbeat", json!({"lease_id": a["lease_id"]})),
        (
            "report",
            json!({"lease_id": a["lease_id"], "report": report}),
        ),
        (
            "fail",
            json!({"lease_id": a["lease_id"], "reason": "gave up late"}),
        ),
    ] {
        let (st, p, ctype) = srv
            .post_raw(&format!("/v1/jobs/{job}/{route}"), Some(&worker), &body)
            .await;
        assert_eq!(st, StatusCode::CONFLICT, "{route}: {p}");
        assert_eq!(ctype, "application/problem+json", "{route}");
        assert!(
            detail(&p).contains(&format!("job {job}'s lease expired"))
                && detail(&p).contains("stop working on it"),
            "{route}: {p}"
        );
    }
    let j: Value = srv.get_json(&format!("/v1/jobs/{job}")).await;
    assert_eq!(
        (
            j["state"].as_str(),
            j["attempts"].as_i64(),
            &j["last_error"]
        ),
        (Some("running"), Some(1), &Value::Null),
        "nothing changed: {j}"
    );
    // The next claim takes the job over with a new lease and nonce; it reports in time.
    let (st, b2) = srv
        .post("/v1/jobs/claim", &worker, &json!({"worker": "a"}))
        .await;
    assert_eq!(st, StatusCode::OK, "{b2}");
    assert_eq!(
        (b2["job"]["id"].as_i64(), b2["job"]["attempts"].as_i64()),
        (Some(job), Some(2))
    );
    assert_ne!(b2["lease_id"], a["lease_id"]);
    assert!(b2["nonce"].is_string() && b2["nonce"] != a["nonce"], "{b2}");
    let report = support::recorded_report(EXACT, &b2, "sm_90");
    let (st, r) = srv
        .post(
            &format!("/v1/jobs/{job}/report"),
            &worker,
            &json!({"lease_id": b2["lease_id"], "report": report}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{r}");
}

async fn many_submissions_with_four_workers(b: Backend) {
    let srv = std::sync::Arc::new(TestServer::start(&b, &["--no-bundled"]).await);
    let submit = srv.token("submit");
    let worker = srv.token("worker");
    let n = 200;
    let mut subs = Vec::new();
    for i in 0..n {
        let srv = srv.clone();
        let token = submit.clone();
        subs.push(tokio::spawn(async move {
            let (m, s) = bundle_files(&format!("load_{i}"), "1.0.0", "");
            let (st, r) = srv
                .post("/v1/kernels", &token, &json!({"manifest": m, "source": s}))
                .await;
            assert_eq!(st, StatusCode::CREATED, "{r}");
            r["job"]["id"].as_i64().unwrap()
        }));
    }
    let mut workers = Vec::new();
    for w in 0..4 {
        let srv = srv.clone();
        let token = worker.clone();
        workers.push(tokio::spawn(async move {
            let mut done = Vec::new();
            let mut idle = 0;
            while idle < 20 {
                let (st, claim) = srv
                    .post(
                        "/v1/jobs/claim",
                        &token,
                        &json!({"worker": format!("w{w}")}),
                    )
                    .await;
                if st == StatusCode::NO_CONTENT {
                    idle += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
                idle = 0;
                let job = claim["job"]["id"].as_i64().unwrap();
                let report = support::recorded_report(EXACT, &claim, "sm_90");
                let (st, r) = srv
                    .post(
                        &format!("/v1/jobs/{job}/report"),
                        &token,
                        &json!({"lease_id": claim["lease_id"], "report": report}),
                    )
                    .await;
                assert_eq!(st, StatusCode::CREATED, "{r}");
                done.push(job);
            }
            done
        }));
    }
    let mut submitted = Vec::new();
    for s in subs {
        submitted.push(s.await.unwrap());
    }
    let mut done = Vec::new();
    for w in workers {
        done.extend(w.await.unwrap());
    }
    submitted.sort();
    done.sort();
    assert_eq!(submitted.len(), n);
    assert_eq!(done, submitted, "every job done exactly once, nothing lost");
    let all: Value = srv.get_json("/v1/kernels?limit=500").await;
    assert_eq!(all["total"].as_u64(), Some(n as u64));
}

async fn openapi_covers_every_route(b: Backend) {
    let srv = TestServer::start(&b, &["--no-bundled"]).await;
    // The route table is the server's own list (`routes::api_routes`), from which the router
    // and the served document both come.
    let doc = serde_json::to_value(kernelize::app::openapi()).unwrap();
    let served: Value = srv.get_json("/openapi.json").await;
    assert_eq!(served, doc, "/openapi.json is the route list's document");
    let paths = doc["paths"].as_object().unwrap();
    for (path, method) in [
        ("/healthz", "get"),
        ("/openapi.json", "get"),
        ("/v1/kernels", "get"),
        ("/v1/kernels", "post"),
        ("/v1/kernels/{name}/{version}", "get"),
        ("/v1/kernels/{name}/{version}/verifications", "get"),
        ("/v1/sources/{digest}", "get"),
        ("/v1/verifications/{id}", "get"),
        ("/v1/jobs/claim", "post"),
        ("/v1/jobs/{id}", "get"),
        ("/v1/jobs/{id}/heartbeat", "post"),
        ("/v1/jobs/{id}/report", "post"),
        ("/v1/jobs/{id}/fail", "post"),
        ("/v1/resolve", "get"),
        ("/v1/tokens", "get"),
        ("/v1/tokens", "post"),
        ("/v1/tokens/{token}/revoke", "post"),
    ] {
        assert!(
            paths.get(path).and_then(|p| p.get(method)).is_some(),
            "{method} {path} missing from /openapi.json"
        );
    }
    let mut operations = 0;
    for (path, item) in paths {
        let concrete = path
            .replace("{name}", "none")
            .replace("{version}", "1.0.0")
            .replace("{digest}", &"0".repeat(64))
            .replace("{id}", "1")
            .replace("{token}", "nobody");
        for method in item.as_object().unwrap().keys() {
            operations += 1;
            // Each operation reaches its handler: not the fallback (404 "no route"), not
            // another method's route (405).
            let r = srv
                .client
                .request(method.to_uppercase().parse().unwrap(), srv.url(&concrete))
                .send()
                .await
                .unwrap();
            let st = r.status();
            let body = r.text().await.unwrap();
            assert_ne!(
                st,
                StatusCode::METHOD_NOT_ALLOWED,
                "{method} {path}: {body}"
            );
            assert!(
                !body.contains("no route"),
                "{method} {path} is not routed: {body}"
            );
            // Every status the document promises is a problem or a success, and every
            // refusal of an operation is declared on it.
            let declared = &item[method]["responses"];
            assert!(
                declared.get(st.as_str()).is_some(),
                "{method} {path} answered {st}, which its responses do not declare: {body}"
            );
        }
    }
    assert!(operations >= 17, "{operations} operations");
    let h: Value = srv.get_json("/healthz").await;
    assert_eq!(h["status"], "ok");
}

/// `kernelize submit DIR --wait --policy P` as a kernel author's CI runs it: exit 0 when the
/// verdict meets the policy, non-zero naming the reason when it does not.
async fn submit_cli_waits_and_gates_on_policy(b: Backend) {
    let srv = TestServer::start(&b, &["--no-bundled"]).await;
    let submit = srv.token("submit");
    let worker = srv.token("worker");
    for (name, fixture, policy, should_pass) in [
        ("cli_exact", EXACT, "bit_exact", true),
        ("cli_off", ONE_ULP_FASTER, "bit_exact", false),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (m, s) = bundle_files(name, "1.0.0", "");
        std::fs::write(dir.path().join("kernel.toml"), m).unwrap();
        std::fs::write(dir.path().join("k.cu"), s).unwrap();
        let child = tokio::process::Command::new(support::bin())
            .args([
                "submit",
                dir.path().to_str().unwrap(),
                "--server",
                &srv.base,
                "--token",
                &submit,
                "--wait",
                "--policy",
                policy,
                "--timeout",
                "60",
            ])
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Act as the GPU worker once the submission is queued.
        let mut claimed = None;
        for _ in 0..100 {
            let (st, c) = srv
                .post("/v1/jobs/claim", &worker, &json!({"worker": "cli-test"}))
                .await;
            if st == StatusCode::OK {
                claimed = Some(c);
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        let claim = claimed.expect("the submission never queued a job");
        let job = claim["job"]["id"].as_i64().unwrap();
        let report = support::recorded_report(fixture, &claim, "sm_90");
        let (st, _) = srv
            .post(
                &format!("/v1/jobs/{job}/report"),
                &worker,
                &json!({"lease_id": claim["lease_id"], "report": report}),
            )
            .await;
        assert_eq!(st, StatusCode::CREATED);
        let out = child.wait_with_output().await.unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.success(),
            should_pass,
            "{name}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("digest sha256:"), "{stdout}");
        if should_pass {
            assert!(
                stdout.contains("policy bit_exact holds for bf16"),
                "{stdout}"
            );
        } else {
            assert!(
                stdout.contains("FAILS for bf16") && stdout.contains("fails bit_exact"),
                "{stdout}"
            );
        }
    }
}

#[test]
fn worker_without_a_gpu_says_so() {
    if verifier::gpu_available() {
        eprintln!("this host has a GPU: the no-GPU message is not tested here");
        return;
    }
    let out = std::process::Command::new(support::bin())
        .args([
            "worker",
            "--server",
            "http://127.0.0.1:9",
            "--token",
            "kz_x",
            "--drain",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no usable CUDA GPU"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A row-wise kernel (rms_norm, llama semantics) for the shape-exact tests.
fn rms_norm_files(name: &str) -> (String, String) {
    let manifest = format!(
        r#"name = "{name}"
version = "1.0.0"
op = "rms_norm"
semantics = "llama"
description = "test kernel"
authors = ["tests"]
license = "MIT"
source = "k.cu"

[entry]
bf16 = "k_bf16"

[launch]
block = 256
grid = "per_row"
"#
    );
    (
        manifest,
        "extern \"C\" __global__ void k_bf16() {}\n".to_string(),
    )
}

/// The recorded rms_norm_llama report (bf16, widths 64 .. 65536, not 11008) with, when
/// `extra_cols` is given, two more bf16 cases at that width (rows 1 and 64): what a worker
/// posts after running a width job.
fn rms_report(claim: &Value, extra_cols: Option<u64>) -> Value {
    let mut r = support::recorded_report("recorded/rms_norm_llama", claim, "sm_90");
    if let Some(cols) = extra_cols {
        let template = r["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["cols"] == 4096)
            .unwrap()
            .clone();
        for rows in [1u64, 64] {
            let mut c = template.clone();
            c["id"] = json!(format!("bf16/{rows}x{cols}/normal"));
            c["rows"] = json!(rows);
            c["cols"] = json!(cols);
            c["exactness"]["elements"] = json!(rows * cols);
            c["exactness"]["ulp_histogram"][0] = json!(rows * cols);
            c["speed"] = Value::Null;
            r["cases"].as_array_mut().unwrap().push(c);
        }
        r["requested_shapes"] = claim["job"]["shapes"].clone();
    }
    r
}

/// The body of `POST /v1/resolve/verifications` for rms_norm (llama) bf16 on sm_90 at `cols`.
fn width_request(cols: u64, rows: Option<u64>) -> Value {
    let mut b = json!({"op": "rms_norm", "semantics": "llama", "dtype": "bf16", "arch": "sm_90", "cols": cols, "policy": "bit_exact"});
    if let Some(r) = rows {
        b["rows"] = json!(r);
    }
    b
}

const WIDTHS: &str = "/v1/resolve/verifications";

/// Issue 13: a kernel verified at 4096 is not handed out at 11008; a GET queues nothing and
/// says how to ask (issue 27 item 5); the explicit request (token scope submit) queues one
/// verification of exactly 11008 (a duplicate request reuses it); the worker gets the shape
/// list, reports a run covering 11008, and then the kernel is handed out at 11008.
async fn shape_exact_resolve_queues_and_runs_a_width_job(b: Backend) {
    let srv = TestServer::start(&b, &["--no-bundled"]).await;
    let submit = srv.token("submit");
    let worker = srv.token("worker");
    let (m, s) = rms_norm_files("width_k");
    let (st, sub) = srv
        .post("/v1/kernels", &submit, &json!({"manifest": m, "source": s}))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{sub}");
    let (_, rec) = support::claim_and_report(&srv, &worker, |claim| rms_report(claim, None)).await;
    let first_vid = rec["verification_id"].as_i64().unwrap();
    // The verification's coverage is recorded: 4096 at rows 64..32768, no 11008.
    let q = |cols: u64, rows: &str| {
        format!("/v1/resolve?op=rms_norm&semantics=llama&dtype=bf16&arch=sm_90&cols={cols}{rows}&policy=bit_exact")
    };
    let (st, r) = srv.get(&q(4096, "")).await;
    assert_eq!(st, StatusCode::OK, "{r}");
    assert_eq!(r["kernel"]["name"], "width_k");
    assert_eq!(r["coverage"]["rule"], "row_length");
    assert_eq!(r["coverage"]["cols"], 4096);
    assert_eq!(r["coverage"]["rows_max"], 32768, "{r}");
    assert!(r["queued_jobs"].as_array().unwrap().is_empty());
    let verified: Vec<u64> = r["coverage"]["verified_cols"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_u64().unwrap())
        .collect();
    assert!(
        verified.contains(&4096) && !verified.contains(&11008),
        "{verified:?}"
    );

    // 11008 was never run: not handed out, and why; a read queues nothing (whatever the
    // parameters) and says how to ask.
    let jobs_before = support::job_count(&srv.db_url).await;
    for rows in ["", "&rows=7", "&rows=512"] {
        let (st, p) = srv.get(&q(11008, rows)).await;
        assert_eq!(st, StatusCode::NOT_FOUND, "{p}");
        let why = p["excluded"][0].as_str().unwrap();
        assert!(
            why.starts_with("width_k 1.0.0: verified at cols 64, 127, 768")
                && why.contains("4096")
                && why.contains("for bf16 on sm_90, not at 11008")
                && why.contains("POST /v1/resolve/verifications"),
            "{why}"
        );
        assert_eq!(p["queued_jobs"], json!([]), "{p}");
        assert_eq!(p["unverified_width"], json!(["width_k 1.0.0"]), "{p}");
        let ask = &p["request_verification"];
        assert_eq!(ask["method"], "POST", "{p}");
        assert_eq!(ask["url"], WIDTHS);
        assert_eq!(ask["scope"], "submit");
        assert_eq!(ask["body"]["cols"], 11008);
        assert_eq!(ask["body"]["op"], "rms_norm");
        assert!(
            detail(&p).contains("nothing was queued") && detail(&p).contains(WIDTHS),
            "{p}"
        );
    }
    assert_eq!(support::job_count(&srv.db_url).await, jobs_before);
    // The explicit request: refused without a token (before its body is read) and with a
    // token of another scope; nothing queued by either.
    let (st, p, _) = srv
        .post_raw(WIDTHS, None, &width_request(11008, None))
        .await;
    assert_eq!(st, StatusCode::UNAUTHORIZED, "{p}");
    let (st, p) = srv.post(WIDTHS, &worker, &width_request(11008, None)).await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{p}");
    assert_eq!(support::job_count(&srv.db_url).await, jobs_before);
    // The body GET handed out is the request; a job for exactly 11008 is queued.
    let (_, p) = srv.get(&q(11008, "")).await;
    let (st, p) = srv
        .post(WIDTHS, &submit, &p["request_verification"]["body"])
        .await;
    assert_eq!(st, StatusCode::CREATED, "{p}");
    assert_eq!(support::job_count(&srv.db_url).await, jobs_before + 1);
    let queued = p["queued_jobs"].as_array().unwrap();
    assert_eq!(queued.len(), 1, "{p}");
    assert_eq!(queued[0]["shape"], "11008:1..64");
    assert_eq!(queued[0]["new"], true);
    assert_eq!(queued[0]["digest"], sub["digest"]);
    let job_id = queued[0]["job_id"].as_i64().unwrap();
    assert_eq!(queued[0]["job_url"], format!("/v1/jobs/{job_id}"));
    assert!(detail(&p).contains(&format!("/v1/jobs/{job_id}")), "{p}");
    let job: Value = srv.get_json(&format!("/v1/jobs/{job_id}")).await;
    assert_eq!(job["state"], "queued");
    assert_eq!(
        job["shapes"],
        json!([{"cols": 11008, "rows_min": 1, "rows_max": 64}])
    );
    assert_eq!(job["width_cols"], 11008);

    // Asking again (with rows too) reuses the pending job: no duplicate.
    for rows in [None, Some(7), Some(512)] {
        let (st, p) = srv.post(WIDTHS, &submit, &width_request(11008, rows)).await;
        assert_eq!(st, StatusCode::OK, "{p}");
        assert_eq!(p["queued_jobs"][0]["job_id"].as_i64(), Some(job_id), "{p}");
        assert_eq!(p["queued_jobs"][0]["new"], false);
    }
    let k: Value = srv.get_json("/v1/kernels/width_k/1.0.0").await;
    assert_eq!(
        k["jobs"].as_array().unwrap().len(),
        2,
        "suite job + one width job: {k}"
    );

    // The dashboard's explorer says so without queueing anything.
    let (st, html) = srv
        .get_page("/policy?policy=bit_exact&dtype=bf16&arch=sm_90&cols=13824&op=rms_norm")
        .await;
    assert_eq!(st, StatusCode::OK);
    assert!(html.contains("not verified at this width"), "{html}");
    let k: Value = srv.get_json("/v1/kernels/width_k/1.0.0").await;
    assert_eq!(
        k["jobs"].as_array().unwrap().len(),
        2,
        "the dashboard queued a job: {k}"
    );

    // A worker claims the width job with its shape list and reports a run covering 11008.
    let (done, rec) = support::claim_and_report(&srv, &worker, |claim| {
        assert_eq!(claim["job"]["id"].as_i64(), Some(job_id));
        assert_eq!(claim["job"]["shapes"][0]["cols"], 11008);
        rms_report(claim, Some(11008))
    })
    .await;
    assert_eq!(done, job_id);
    assert_eq!(rec["shapes_not_covered"], json!([]), "{rec}");
    let vid = rec["verification_id"].as_i64().unwrap();
    assert!(vid > first_vid);
    let job: Value = srv.get_json(&format!("/v1/jobs/{job_id}")).await;
    assert_eq!(job["state"], "done");
    assert_eq!(job["verification_url"], format!("/v1/verifications/{vid}"));

    // Now 11008 is handed out, from the new verification, with its row coverage.
    let (st, r) = srv.get(&q(11008, "")).await;
    assert_eq!(st, StatusCode::OK, "{r}");
    assert_eq!(r["verification_id"].as_i64(), Some(vid));
    assert_eq!(r["coverage"]["cols"], 11008);
    assert_eq!(r["coverage"]["row_counts"], json!([1, 64]));
    assert_eq!(r["coverage"].get("rows_in_range"), None);
    // Rows outside the verified range at that width: still handed out, and said.
    let (st, r) = srv.get(&q(11008, "&rows=4096")).await;
    assert_eq!(st, StatusCode::OK, "{r}");
    assert_eq!(r["coverage"]["rows_in_range"], false);
    assert!(
        r["coverage"]["note"]
            .as_str()
            .unwrap()
            .contains("outside the rows verified"),
        "{r}"
    );
    let k: Value = srv.get_json("/v1/kernels/width_k/1.0.0").await;
    assert_eq!(k["jobs"].as_array().unwrap().len(), 2, "{k}");

    // The kernel page shows each verification's coverage.
    let html = srv
        .client
        .get(srv.url("/kernels/width_k/1.0.0"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(html.contains("Coverage"), "{html}");
    assert!(
        html.contains("<strong>11008</strong> (1..64, 2 counts)"),
        "{html}"
    );
    assert!(
        html.contains("widths 11008:1..64"),
        "the job's shape list: {html}"
    );

    // A report that does not cover the asked width is recorded and said, and the width is not
    // queued again on its account (no endless loop of jobs for a width the worker never runs).
    let (st, p) = srv.post(WIDTHS, &submit, &width_request(13824, None)).await;
    assert_eq!(st, StatusCode::CREATED, "{p}");
    let j13824 = p["queued_jobs"][0]["job_id"].as_i64().unwrap();
    let (_, rec) = support::claim_and_report(&srv, &worker, |claim| {
        let mut r = rms_report(claim, None);
        r["requested_shapes"] = claim["job"]["shapes"].clone();
        r
    })
    .await;
    assert_eq!(rec["shapes_not_covered"], json!(["13824:1..64"]), "{rec}");
    let (st, p) = srv.get(&q(13824, "")).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    assert!(p["queued_jobs"].as_array().unwrap().is_empty(), "{p}");
    assert!(
        p["excluded"][0]
            .as_str()
            .unwrap()
            .contains("did not cover it"),
        "{p}"
    );
    let (st, p) = srv.post(WIDTHS, &submit, &width_request(13824, None)).await;
    assert_eq!(st, StatusCode::OK, "{p}");
    assert_eq!(p["queued_jobs"], json!([]), "not queued again: {p}");
    let _ = j13824;

    // Elementwise ops: covered at any element count up to the largest verified.
    let (m, s) = bundle_files("width_silu", "1.0.0", "");
    srv.post("/v1/kernels", &submit, &json!({"manifest": m, "source": s}))
        .await;
    verify_next(&srv, &worker, EXACT, "sm_90").await;
    let e = |n: u64| format!("/v1/resolve?op=silu&dtype=bf16&arch=sm_90&cols={n}&policy=bit_exact");
    let (st, r) = srv.get(&e(11_008 * 3)).await;
    assert_eq!(st, StatusCode::OK, "{r}");
    assert_eq!(r["coverage"]["rule"], "elements");
    let max = r["coverage"]["max_elements"].as_u64().unwrap();
    assert_eq!(max, 32768 * 4096);
    let (st, p) = srv.get(&e(max + 1)).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{p}");
    assert!(
        p["excluded"][0]
            .as_str()
            .unwrap()
            .contains(&format!("verified up to {max} elements")),
        "{p}"
    );
    assert_eq!(p["queued_jobs"], json!([]), "{p}");
    let (st, p) = srv
        .post(WIDTHS, &submit, &p["request_verification"]["body"])
        .await;
    assert_eq!(st, StatusCode::CREATED, "{p}");
    assert_eq!(p["queued_jobs"][0]["shape"], format!("{}:1..1", max + 1));
}

/// Width requests are capped: at most `--max-pending-width-jobs` width jobs are pending;
/// beyond it the answer says so and queues nothing.
async fn width_jobs_are_capped(b: Backend) {
    let srv = TestServer::start(&b, &["--no-bundled", "--max-pending-width-jobs", "1"]).await;
    let submit = srv.token("submit");
    let worker = srv.token("worker");
    let (m, s) = rms_norm_files("capped_k");
    srv.post("/v1/kernels", &submit, &json!({"manifest": m, "source": s}))
        .await;
    support::claim_and_report(&srv, &worker, |claim| rms_report(claim, None)).await;
    let (st, p) = srv.post(WIDTHS, &submit, &width_request(11008, None)).await;
    assert_eq!(st, StatusCode::CREATED, "{p}");
    assert_eq!(p["queued_jobs"].as_array().unwrap().len(), 1, "{p}");
    assert_eq!(p["queue_full"], Value::Null);
    let (st, p) = srv.post(WIDTHS, &submit, &width_request(13824, None)).await;
    assert_eq!(st, StatusCode::OK, "{p}");
    assert!(p["queued_jobs"].as_array().unwrap().is_empty(), "{p}");
    assert!(
        p["queue_full"]
            .as_str()
            .unwrap()
            .contains("1 verifications of unverified widths are pending"),
        "{p}"
    );
    assert!(
        p["excluded"][0].as_str().unwrap().contains("not queued"),
        "{p}"
    );
    let k: Value = srv.get_json("/v1/kernels/capped_k/1.0.0").await;
    assert_eq!(k["jobs"].as_array().unwrap().len(), 2, "{k}");
}

/// `kernelize verify --cols/--rows/--shape`: a bad value is refused before any GPU work, with
/// what was wrong and how to write it.
#[test]
fn verify_cli_names_bad_shapes() {
    let dir = kernels_dir().join("rms_norm_llama");
    for (args, says) in [
        (
            vec!["--rows", "1..8"],
            "--rows applies to the widths given with --cols",
        ),
        (vec!["--cols", "0"], "--cols 0: cols must be at least 1"),
        (
            vec!["--cols", "11008", "--rows", "1..x"],
            "write A..B (e.g. 1..64) or N",
        ),
        (
            vec!["--cols", "11008", "--rows", "64..1"],
            "write A..B with 1 <= A <= B",
        ),
        (
            vec!["--shape", "11008:1-64"],
            "write COLS:A..B, e.g. 11008:1..64",
        ),
        (
            vec!["--cols", "1000000", "--rows", "1..100000"],
            "more than 2^31 elements",
        ),
    ] {
        let out = std::process::Command::new(support::bin())
            .arg("verify")
            .arg(&dir)
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(
            !err.contains("CUDA"),
            "{args:?}: checked before the GPU: {err}"
        );
    }
}

/// The tokens the store holds under `name` (the audit log records each creation).
async fn tokens_created(db_url: &str, name: &str) -> usize {
    let store = kernel_store::Store::connect(db_url).await.unwrap();
    let entries = store.audit_entries(10_000).await.unwrap();
    store.close().await;
    entries
        .iter()
        .filter(|e| e.action == "token.created" && e.subject == name)
        .count()
}

/// The token in `file`, checked to be valid with scope `worker` in the store at `db_url`.
async fn valid_worker_token(db_url: &str, file: &std::path::Path) -> String {
    let token = std::fs::read_to_string(file)
        .unwrap_or_else(|e| panic!("the token file {} was not written: {e}", file.display()))
        .trim()
        .to_string();
    let store = kernel_store::Store::connect(db_url).await.unwrap();
    let held = store.check_token(&token).await.unwrap();
    store.close().await;
    let kernel_store::TokenCheck::Valid(info) = held else {
        panic!(
            "the token in {} is not valid in the store: {held:?}",
            file.display()
        )
    };
    assert_eq!(
        info.scopes,
        vec!["worker".to_string()],
        "{}",
        file.display()
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(file).unwrap().permissions().mode() & 0o777;
        assert_eq!(
            mode,
            0o600,
            "{} must be readable by its owner only",
            file.display()
        );
    }
    token
}

async fn serve_worker_keeps_one_token_across_restarts(b: Backend) {
    // SQLite: the default file beside the database; PostgreSQL: an explicit one.
    let dir = tempfile::tempdir().unwrap();
    let (file, extra): (std::path::PathBuf, Vec<String>) = match &b {
        Backend::Sqlite(d) => (
            std::path::PathBuf::from(format!("{}.worker-token", d.file().display())),
            vec![],
        ),
        Backend::Postgres(_) => {
            let f = dir.path().join("state/worker.token");
            (
                f.clone(),
                vec!["--worker-token-file".into(), f.display().to_string()],
            )
        }
    };
    let mut args: Vec<&str> = vec!["--worker"];
    args.extend(extra.iter().map(String::as_str));
    let mut tokens = vec![];
    let mut keys = vec![];
    let key_file = file.with_file_name(format!(
        "{}.key",
        file.file_name().unwrap().to_string_lossy()
    ));
    for _ in 0..2 {
        let mut srv = TestServer::start(&b, &args).await;
        // Answered once the embedded worker's token is settled (before serving starts).
        srv.get_json("/healthz").await;
        tokens.push(valid_worker_token(&srv.db_url, &file).await);
        keys.push(std::fs::read_to_string(&key_file).expect("the embedded worker's key file"));
        srv.sigkill();
    }
    assert_eq!(
        tokens[0], tokens[1],
        "the second start must reuse the first start's token"
    );
    // Its signing key too: kept beside the token (mode 0600) and registered once.
    assert_eq!(keys[0], keys[1], "the second start must reuse the key");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&key_file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let store = kernel_store::Store::connect(&b.url()).await.unwrap();
    let registered = store.worker_keys().await.unwrap();
    store.close().await;
    assert_eq!(registered.len(), 1, "{registered:?}");
    assert!(registered[0].name.starts_with("embedded-worker-"));
    assert_eq!(
        tokens_created(&b.url(), "embedded-worker").await,
        1,
        "two starts over one database create one worker token"
    );
    // A token the database does not know (a file from another database) is replaced.
    std::fs::write(&file, "kz_from_another_database\n").unwrap();
    let srv = TestServer::start(&b, &args).await;
    srv.get_json("/healthz").await;
    let replaced = valid_worker_token(&srv.db_url, &file).await;
    assert_ne!(replaced, tokens[0]);
    assert_eq!(tokens_created(&b.url(), "embedded-worker").await, 2);
}

/// The Docker set-up's flow: a one-shot `token ensure` writes the token file, workers read it
/// with `--token-file`; running it again keeps the token.
async fn token_ensure_hands_a_worker_one_token_file(b: Backend) {
    let srv = TestServer::start(&b, &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token/worker.token");
    let ensure = || {
        let out = std::process::Command::new(support::bin())
            .args([
                "token",
                "ensure",
                "--scope",
                "worker",
                "--name",
                "gpu-workers",
            ])
            .arg("--file")
            .arg(&file)
            .args(["--db", &srv.db_url])
            .env("RUST_LOG", "warn")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "token ensure failed: {err}");
        assert!(
            out.stdout.is_empty(),
            "the token must not be printed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        err
    };
    assert!(
        ensure().contains("created"),
        "the first run creates the token"
    );
    let first = valid_worker_token(&srv.db_url, &file).await;
    assert!(ensure().contains("kept"), "the second run keeps it");
    assert_eq!(valid_worker_token(&srv.db_url, &file).await, first);
    assert_eq!(tokens_created(&srv.db_url, "gpu-workers").await, 1);
    // The token works for a worker's call.
    let (st, body) = srv
        .post("/v1/jobs/claim", &first, &json!({"worker": "w"}))
        .await;
    assert!(
        st == StatusCode::OK || st == StatusCode::NO_CONTENT,
        "claim with the ensured token: {st} {body}"
    );
    // A worker without the file says how to make one (checked before the GPU).
    let out = std::process::Command::new(support::bin())
        .args(["worker", "--server", &srv.base, "--token-file"])
        .arg(dir.path().join("missing.token"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("kernelize token ensure --scope worker --file"),
        "{err}"
    );
}

/// The JSON log lines (stderr of `serve --log-json`) in `log`, once `ready` holds for one.
async fn log_lines(log: &std::path::Path, ready: impl Fn(&Value) -> bool) -> Vec<Value> {
    for _ in 0..100 {
        let lines: Vec<Value> = std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        if lines.iter().any(&ready) {
            return lines;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!(
        "the expected log line never came; the log:\n{}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.char_indices().all(|(i, c)| {
            if [8, 13, 18, 23].contains(&i) {
                c == '-'
            } else {
                c.is_ascii_hexdigit()
            }
        })
}

async fn request_ids_flow_into_logs_and_back(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("serve.log");
    let srv = TestServer::start_logging_to(&b, &["--log-json"], &log).await;
    let submit = srv.token("submit");
    let http = reqwest::Client::new();

    // 1. The caller's id: back in the response, and on every line the request logged.
    let (manifest, source) = bundle_files("request_id_probe", "1.0.0", "");
    let r = http
        .post(srv.url("/v1/kernels"))
        .bearer_auth(&submit)
        .header("x-request-id", "probe-42")
        .json(&json!({"manifest": manifest, "source": source}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(
        r.headers()["x-request-id"],
        "probe-42",
        "the caller's id comes back"
    );
    let lines = log_lines(&log, |l| {
        l["span"]["request_id"] == "probe-42"
            && l["fields"]["message"] == "finished processing request"
    })
    .await;
    let of_probe: Vec<&Value> = lines
        .iter()
        .filter(|l| l["span"]["request_id"] == "probe-42")
        .collect();
    let messages: Vec<&str> = of_probe
        .iter()
        .map(|l| l["fields"]["message"].as_str().unwrap_or(""))
        .collect();
    assert!(
        messages.contains(&"kernel submitted"),
        "the handler's own line carries the request id: {messages:?}"
    );
    assert!(
        messages.contains(&"finished processing request"),
        "{messages:?}"
    );
    assert!(of_probe.iter().all(|l| l["span"]["uri"] == "/v1/kernels"));
    // No line logged while handling a request lacks its id.
    for l in &lines {
        let target = l["target"].as_str().unwrap_or("");
        if target.starts_with("kernelize::api") || target.starts_with("tower_http") {
            assert!(
                l["span"]["request_id"]
                    .as_str()
                    .is_some_and(|s| !s.is_empty()),
                "a request's log line without a request id: {l}"
            );
        }
    }

    // 2. No id sent: one is made, returned, and logged.
    let r = http.get(srv.url("/healthz")).send().await.unwrap();
    let made = r.headers()["x-request-id"].to_str().unwrap().to_string();
    assert!(is_uuid(&made), "a generated id is a UUID: `{made}`");
    log_lines(&log, |l| {
        l["span"]["request_id"] == made.as_str() && l["span"]["uri"] == "/healthz"
    })
    .await;

    // 3. An id unfit for a log line (too long) is replaced, not echoed.
    let long = "x".repeat(200);
    let r = http
        .get(srv.url("/healthz"))
        .header("x-request-id", &long)
        .send()
        .await
        .unwrap();
    let back = r.headers()["x-request-id"].to_str().unwrap();
    assert!(
        is_uuid(back),
        "an over-long id is replaced by a UUID, got `{back}`"
    );
}
/// `kernelize token ARGS --db URL`: (success, stdout, stderr).
fn token_cli(srv: &TestServer, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(support::bin())
        .arg("token")
        .args(args)
        .args(["--db", &srv.db_url])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A token made with the CLI: `token create --scope SCOPE --name NAME ARGS`.
fn named_token(srv: &TestServer, scope: &str, name: &str, args: &[&str]) -> String {
    let mut all = vec!["create", "--scope", scope, "--name", name];
    all.extend_from_slice(args);
    let (ok, out, err) = token_cli(srv, &all);
    assert!(ok, "{err}");
    out.trim().to_string()
}

/// Issue 17: the lease id alone binds nothing. Another worker token presenting the right lease
/// is refused for heartbeat, report and fail (403, audited); the claiming token goes on.
async fn another_workers_token_cannot_use_a_lease(b: Backend) {
    let srv = TestServer::start(&b, &["--no-bundled"]).await;
    let submit = srv.token("submit");
    let honest = named_token(&srv, "worker", "gpu-honest", &[]);
    let other = named_token(&srv, "worker", "gpu-other", &[]);
    let (m, s) = bundle_files("bound_k", "1.0.0", "");
    srv.post("/v1/kernels", &submit, &json!({"manifest": m, "source": s}))
        .await;
    let (st, claim) = srv
        .post("/v1/jobs/claim", &honest, &json!({"worker": "a"}))
        .await;
    assert_eq!(st, StatusCode::OK, "{claim}");
    let job = claim["job"]["id"].as_i64().unwrap();
    let lease = claim["lease_id"].clone();
    let report = support::recorded_report(EXACT, &claim, "sm_90");
    for (route, body) in [
        ("heartbeat", json!({"lease_id": lease})),
        ("report", json!({"lease_id": lease, "report": report})),
        ("fail", json!({"lease_id": lease, "reason": "sabotage"})),
    ] {
        let (st, p, ctype) = srv
            .post_raw(&format!("/v1/jobs/{job}/{route}"), Some(&other), &body)
            .await;
        assert_eq!(st, StatusCode::FORBIDDEN, "{route}: {p}");
        assert_eq!(ctype, "application/problem+json", "{route}");
        assert!(
            detail(&p).contains("claimed by another worker token")
                && detail(&p).contains("recorded in the audit log"),
            "{route}: {p}"
        );
    }
    let audit = support::audit_actions(&b, &srv.db_url).await;
    assert_eq!(
        audit
            .iter()
            .filter(|a| *a == "job.claim_token_mismatch")
            .count(),
        3,
        "{audit:?}"
    );
    let j: Value = srv.get_json(&format!("/v1/jobs/{job}")).await;
    assert_eq!(j["state"], "running", "nothing changed: {j}");
    // The claiming token goes on with its lease.
    let (st, _) = srv
        .post(
            &format!("/v1/jobs/{job}/heartbeat"),
            &honest,
            &json!({"lease_id": lease}),
        )
        .await;
    assert_eq!(st, StatusCode::OK);
    let (st, r) = srv
        .post(
            &format!("/v1/jobs/{job}/report"),
            &honest,
            &json!({"lease_id": lease, "report": report}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{r}");
    assert_eq!(r["class"], "bit_exact");
}

/// Forged reports are refused over HTTP with a 422 naming the field (and audited); the job
/// stays the claimant's, whose honest report is then accepted. A flattering summary is not
/// refused but replaced by what the cases give.
async fn forged_reports_are_refused(b: Backend) {
    let srv = TestServer::start(&b, &["--no-bundled"]).await;
    let submit = srv.token("submit");
    let worker = srv.token("worker");
    let (m, s) = bundle_files("forged_k", "1.0.0", "");
    srv.post("/v1/kernels", &submit, &json!({"manifest": m, "source": s}))
        .await;
    let (_, claim) = srv
        .post("/v1/jobs/claim", &worker, &json!({"worker": "f"}))
        .await;
    let job = claim["job"]["id"].as_i64().unwrap();
    let honest = support::recorded_report(ONE_ULP_FASTER, &claim, "sm_90");
    type Forge = fn(&mut Value);
    let forgeries: Vec<(&str, Forge, &str, &str)> = vec![
        (
            "bit-exact by decree: mismatches zeroed, histogram kept",
            |r| {
                for c in r["cases"].as_array_mut().unwrap() {
                    c["exactness"]["mismatches"] = json!(0);
                    c["exactness"]["mismatch_fraction"] = json!(0.0);
                }
            },
            "exactness.mismatches",
            "no element differs, yet a difference is reported",
        ),
        (
            "more mismatches than elements",
            |r| {
                let e = &mut r["cases"][0]["exactness"];
                e["mismatches"] = json!(e["elements"].as_u64().unwrap() * 2);
            },
            "cases[0].exactness.mismatches",
            "no more elements can differ than were compared",
        ),
        (
            "an H200 on sm_80",
            |r| r["device"]["arch"] = json!("sm_80"),
            "device.arch",
            "an H200 is sm_90, not sm_80",
        ),
        (
            "a copy bandwidth above the H200's peak",
            |r| r["device"]["copy_gbps"] = json!(20000.0),
            "device.copy_gbps",
            "peak DRAM bandwidth of an H200",
        ),
        (
            "a speed above the roofline, consistently derived",
            |r| {
                let copy = r["device"]["copy_gbps"].as_f64().unwrap();
                for c in r["cases"].as_array_mut().unwrap() {
                    let s = &mut c["speed"];
                    if s.is_object() {
                        let bytes = s["bytes_moved"].as_f64().unwrap();
                        let median = bytes / (2.0 * copy) / 1e3;
                        s["median_us"] = json!(median);
                        s["gbps"] = json!(bytes / median / 1e3);
                        s["copy_fraction"] = json!(bytes / median / 1e3 / copy);
                        s["speedup"] = json!(s["reference_median_us"].as_f64().unwrap() / median);
                    }
                }
            },
            "speed.gbps",
            "above the roofline of the device the report names",
        ),
        (
            "another kernel's op",
            |r| r["kernel"]["op"] = json!("gelu"),
            "kernel.op",
            "the report is for `gelu`",
        ),
        (
            "a case of another shape under its id",
            |r| r["cases"][0]["rows"] = json!(3),
            "cases[0].id",
            "does not name the case's own fields",
        ),
        (
            "a made-up verifier",
            |r| r["verifier_version"] = json!("trust me"),
            "verifier_version",
            "is not a version",
        ),
    ];
    for (what, forge, field, says) in forgeries {
        let mut r = honest.clone();
        forge(&mut r);
        let (st, p, ctype) = srv
            .post_raw(
                &format!("/v1/jobs/{job}/report"),
                Some(&worker),
                &json!({"lease_id": claim["lease_id"], "report": r}),
            )
            .await;
        assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{what}: {p}");
        assert_eq!(ctype, "application/problem+json", "{what}");
        let named = p["problems"]
            .as_array()
            .unwrap()
            .iter()
            .any(|q| q["field"].as_str().unwrap().ends_with(field) && detail(q).contains(says));
        assert!(
            named,
            "{what}: no problem on `{field}` saying `{says}`: {p}"
        );
        assert!(
            detail(&p).starts_with("the report is refused: `"),
            "{what}: {p}"
        );
        assert!(p["field"].is_string(), "{what}: {p}");
    }
    let audit = support::audit_actions(&b, &srv.db_url).await;
    assert_eq!(
        audit
            .iter()
            .filter(|a| *a == "verification.refused")
            .count(),
        8,
        "{audit:?}"
    );
    // A flattering summary: the cases say 1 ulp, the summary says bit-exact.
    let mut flattering = honest.clone();
    flattering["summary"]["overall"]["class"] = json!("bit_exact");
    flattering["summary"]["overall"]["mismatches"] = json!(0);
    flattering["summary"]["per_dtype"]["bf16"]["class"] = json!("bit_exact");
    let (st, rec) = srv
        .post(
            &format!("/v1/jobs/{job}/report"),
            &worker,
            &json!({"lease_id": claim["lease_id"], "report": flattering}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{rec}");
    assert_eq!(rec["class"], "ulp:1", "the class the cases give: {rec}");
    let rewritten: Vec<&str> = rec["summary_rederived"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    for f in [
        "summary.overall.class",
        "summary.overall.mismatches",
        "summary.per_dtype.bf16.class",
    ] {
        assert!(rewritten.contains(&f), "{f} not in {rewritten:?}");
    }
    let v: Value = srv.get_json(rec["url"].as_str().unwrap()).await;
    assert_eq!(v["report"]["summary"]["overall"]["class"], "ulp:1");
    assert_eq!(v["exactness_class"], "ulp:1");
    let audit = support::audit_actions(&b, &srv.db_url).await;
    assert!(audit.iter().any(|a| a == "verification.summary_rederived"));
}

/// By default a hub stores only reports of the verifier's current suite, whose case list it
/// redraws: a report of an older suite is refused, and so is one labelled with the current
/// suite whose cases are not the ones it draws for the report's seed.
async fn a_hub_accepts_its_own_suite_by_default(b: Backend) {
    let current = verifier::cases::SUITE_VERSION;
    let srv = TestServer::start(&b, &["--no-bundled", "--min-suite-version", current]).await;
    let submit = srv.token("submit");
    let worker = srv.token("worker");
    let (m, s) = bundle_files("suite_k", "1.0.0", "");
    srv.post("/v1/kernels", &submit, &json!({"manifest": m, "source": s}))
        .await;
    let (_, claim) = srv
        .post("/v1/jobs/claim", &worker, &json!({"worker": "s"}))
        .await;
    let job = claim["job"]["id"].as_i64().unwrap();
    let old = support::recorded_report(EXACT, &claim, "sm_90");
    let (st, p) = srv
        .post(
            &format!("/v1/jobs/{job}/report"),
            &worker,
            &json!({"lease_id": claim["lease_id"], "report": old}),
        )
        .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{p}");
    assert_eq!(p["field"], "suite_version", "{p}");
    assert!(
        detail(&p).contains(&format!("it accepts {current}"))
            && detail(&p).contains("--min-suite-version"),
        "{p}"
    );
    // Labelled with the current suite, the recorded cases (its fixed anchors) lack the decode
    // batches and random shapes the suite draws for the seed.
    let mut relabelled = old.clone();
    relabelled["suite_version"] = json!(current);
    let (st, p) = srv
        .post(
            &format!("/v1/jobs/{job}/report"),
            &worker,
            &json!({"lease_id": claim["lease_id"], "report": relabelled}),
        )
        .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{p}");
    assert_eq!(p["field"], "cases", "{p}");
    assert!(
        detail(&p).contains(&format!("cases suite {current} draws for seed"))
            && detail(&p).contains("are missing"),
        "{p}"
    );
    // And a case it never draws is named.
    let mut extra = relabelled.clone();
    let mut c = extra["cases"][0].clone();
    c["id"] = json!("bf16/2x64/normal");
    c["rows"] = json!(2);
    c["exactness"]["elements"] = json!(128);
    c["exactness"]["ulp_histogram"] = json!([128, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    extra["cases"].as_array_mut().unwrap().push(c);
    let (st, p) = srv
        .post(
            &format!("/v1/jobs/{job}/report"),
            &worker,
            &json!({"lease_id": claim["lease_id"], "report": extra}),
        )
        .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{p}");
    assert!(
        p["problems"].to_string().contains(&format!(
            "case `bf16/2x64/normal` is not a case of suite {current} for seed"
        )),
        "{p}"
    );
}

/// Tokens: an expiry (`--expires-in`), `token list` (never a secret), `token revoke NAME|ID`,
/// on the CLI and on the API (`/v1/tokens`, scope admin). Expired and revoked tokens stop
/// working at once with a 401 that says which, a worker's mid-job included.
async fn tokens_expire_list_and_revoke_over_the_cli_and_the_api(b: Backend) {
    let srv = TestServer::start(&b, &["--no-bundled"]).await;
    let submit = srv.token("submit");
    let short = named_token(&srv, "worker", "short-lived", &["--expires-in", "2s"]);
    let gpu = named_token(&srv, "worker", "gpu-7", &[]);
    let forever = named_token(&srv, "submit", "ci-forever", &["--expires-in", "never"]);
    let (ok, _, err) = token_cli(
        &srv,
        &["create", "--scope", "worker", "--expires-in", "90 days"],
    );
    assert!(!ok && err.contains("not a lifetime"), "{err}");
    let (st, _) = srv
        .post("/v1/jobs/claim", &short, &json!({"worker": "x"}))
        .await;
    assert_eq!(st, StatusCode::NO_CONTENT, "a fresh token works");
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    let (st, p) = srv
        .post("/v1/jobs/claim", &short, &json!({"worker": "x"}))
        .await;
    assert_eq!(st, StatusCode::UNAUTHORIZED, "{p}");
    assert!(
        detail(&p).contains("`short-lived` expired at") && p["reason"] == "expired",
        "{p}"
    );

    // The list: every token, its state, never a secret.
    let (ok, table, err) = token_cli(&srv, &["list"]);
    assert!(ok, "{err}");
    for needle in [
        "short-lived",
        "gpu-7",
        "ci-forever",
        "expired",
        "active",
        "never",
        "last used",
    ] {
        assert!(table.contains(needle), "`{needle}` not in:\n{table}");
    }
    for secret in [&short, &gpu, &forever, &submit] {
        assert!(
            !table.contains(secret.as_str()),
            "a secret is listed:\n{table}"
        );
    }
    let (ok, listed, _) = token_cli(&srv, &["list", "--json"]);
    assert!(ok);
    let listed: Value = serde_json::from_str(&listed).unwrap();
    let gpu7 = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "gpu-7")
        .unwrap()
        .clone();
    assert!(
        gpu7["expires_at"].is_string() && gpu7["revoked_at"].is_null(),
        "{gpu7}"
    );
    assert!(gpu7.get("token_hash").is_none());

    // A worker mid-job whose token is revoked: its next heartbeat is refused, the job queued.
    let (m, s) = bundle_files("revoke_k", "1.0.0", "");
    srv.post("/v1/kernels", &submit, &json!({"manifest": m, "source": s}))
        .await;
    let (st, claim) = srv
        .post("/v1/jobs/claim", &gpu, &json!({"worker": "g7"}))
        .await;
    assert_eq!(st, StatusCode::OK, "{claim}");
    let job = claim["job"]["id"].as_i64().unwrap();
    let (ok, out, err) = token_cli(&srv, &["revoke", "gpu-7"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("token `gpu-7`") && out.contains(&format!("jobs queued again: {job}")),
        "{out}"
    );
    let (st, p) = srv
        .post(
            &format!("/v1/jobs/{job}/heartbeat"),
            &gpu,
            &json!({"lease_id": claim["lease_id"]}),
        )
        .await;
    assert_eq!(st, StatusCode::UNAUTHORIZED, "{p}");
    assert!(
        detail(&p).contains("`gpu-7` was revoked at") && p["reason"] == "revoked",
        "{p}"
    );
    let j: Value = srv.get_json(&format!("/v1/jobs/{job}")).await;
    assert_eq!(
        (j["state"].as_str(), j["attempts"].as_i64()),
        (Some("queued"), Some(0)),
        "{j}"
    );
    let (ok, out, _) = token_cli(&srv, &["revoke", &gpu7["id"].to_string()]);
    assert!(ok && out.contains("already revoked"), "{out}");

    // The API, with an admin token.
    let admin = named_token(&srv, "admin", "ops", &["--expires-in", "1h"]);
    let (st, p) = srv.get("/v1/tokens").await;
    assert_eq!(st, StatusCode::UNAUTHORIZED, "{p}");
    let (st, p, _) = srv
        .post_raw(
            "/v1/tokens",
            Some(&submit),
            &json!({"name": "x", "scopes": ["worker"]}),
        )
        .await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{p}");
    let (st, created) = srv
        .post(
            "/v1/tokens",
            &admin,
            &json!({"name": "api-worker", "scopes": ["worker"], "expires_in": "30d"}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{created}");
    let api_worker = created["token"].as_str().unwrap().to_string();
    assert!(created["expires_at"].is_string(), "{created}");
    let (st, _) = srv
        .post("/v1/jobs/claim", &api_worker, &json!({"worker": "api"}))
        .await;
    assert_eq!(st, StatusCode::OK, "the API's token works");
    for (body, field) in [
        (
            json!({"name": "y", "scopes": ["worker"], "expires_in": "forever"}),
            "expires_in",
        ),
        (json!({"name": "y", "scopes": ["root"]}), "scopes"),
        (json!({"name": "y", "scopes": []}), "scopes"),
        (json!({"name": "12", "scopes": ["worker"]}), "name"),
    ] {
        let (st, p) = srv.post("/v1/tokens", &admin, &body).await;
        assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {p}");
        assert_eq!(p["field"], field, "{body}: {p}");
    }
    let list = {
        let r = srv
            .client
            .get(srv.url("/v1/tokens"))
            .bearer_auth(&admin)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        r.text().await.unwrap()
    };
    assert!(
        list.contains("\"api-worker\"") && list.contains("\"expired\":true"),
        "{list}"
    );
    assert!(
        !list.contains(&api_worker) && !list.contains("token_hash"),
        "{list}"
    );
    named_token(&srv, "worker", "twin", &[]);
    named_token(&srv, "worker", "twin", &[]);
    let (st, p) = srv.post("/v1/tokens/twin/revoke", &admin, &json!({})).await;
    assert_eq!(st, StatusCode::CONFLICT, "{p}");
    assert!(detail(&p).contains("2 tokens are named `twin`"), "{p}");
    let (st, r) = srv
        .post("/v1/tokens/api-worker/revoke", &admin, &json!({}))
        .await;
    assert_eq!(st, StatusCode::OK, "{r}");
    assert_eq!(r["already_revoked"], false);
    assert_eq!(r["requeued_jobs"].as_array().unwrap().len(), 1, "{r}");
    let (st, _) = srv
        .post("/v1/jobs/claim", &api_worker, &json!({"worker": "api"}))
        .await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    let audit = support::audit_actions(&b, &srv.db_url).await;
    assert_eq!(
        audit.iter().filter(|a| *a == "token.revoked").count(),
        2,
        "{audit:?}"
    );
    assert!(
        audit.iter().filter(|a| *a == "token.created").count() >= 8,
        "{audit:?}"
    );
}

/// A database left by the release before claim tokens (schema 0002): a job running there and
/// a token without an expiry. `kernelize serve` upgrades it: the job is queued again, the old
/// lease is refused, the old token still works (expiring in 90 days) and claims with itself.
async fn a_database_from_before_claim_tokens_is_served_after_its_upgrade(b: Backend) {
    let url = b.url();
    let old = kernel_store::Store::connect(&url).await.unwrap();
    old.migrate_to(2).await.unwrap();
    let (m, s) = bundle_files("old_k", "1.0.0", "");
    let bundle = kernel_registry::KernelBundle::from_parts(&m, &s).unwrap();
    old.insert_kernel(&bundle, "submitted", "tests")
        .await
        .unwrap();
    old.execute_raw(
        "UPDATE verification_jobs SET state = 'running', attempts = 1, worker = 'old', \
         lease_id = 'old-lease', lease_expires_ms = 99999999999999",
    )
    .await
    .unwrap();
    old.execute_raw(&format!(
        "INSERT INTO api_tokens (name, token_hash, scopes, created_at) \
         VALUES ('legacy-worker', '{}', ',worker,', '2026-01-01T00:00:00Z')",
        kernel_store::hash_token("kz_legacy_worker")
    ))
    .await
    .unwrap();
    old.close().await;

    let srv = TestServer::start_on(&b, &url, &["--no-bundled"]).await;
    let k: Value = srv.get_json("/v1/kernels/old_k/1.0.0").await;
    let job = k["jobs"][0]["id"].as_i64().unwrap();
    assert_eq!(k["jobs"][0]["state"], "queued", "{k}");
    assert!(
        k["jobs"][0]["last_error"]
            .as_str()
            .unwrap()
            .contains("migration 0004"),
        "{k}"
    );
    let (st, p) = srv
        .post(
            &format!("/v1/jobs/{job}/heartbeat"),
            "kz_legacy_worker",
            &json!({"lease_id": "old-lease"}),
        )
        .await;
    assert_eq!(
        st,
        StatusCode::CONFLICT,
        "the pre-upgrade lease is gone: {p}"
    );
    let (st, claim) = srv
        .post(
            "/v1/jobs/claim",
            "kz_legacy_worker",
            &json!({"worker": "after"}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{claim}");
    assert_eq!(
        (
            claim["job"]["id"].as_i64(),
            claim["job"]["attempts"].as_i64()
        ),
        (Some(job), Some(1))
    );
    let report = support::recorded_report(EXACT, &claim, "sm_90");
    let (st, r) = srv
        .post(
            &format!("/v1/jobs/{job}/report"),
            "kz_legacy_worker",
            &json!({"lease_id": claim["lease_id"], "report": report}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{r}");
    let (ok, table, _) = token_cli(&srv, &["list"]);
    assert!(ok && table.contains("legacy-worker"), "{table}");
}
