//! End-to-end tests: the real `kernelize` binary serving on an ephemeral port, driven over
//! HTTP, on SQLite and on PostgreSQL.

mod support;

use reqwest::StatusCode;
use serde_json::{json, Value};
use support::{bundle_files, kernels_dir, Backend, TestServer};

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
    policy_gating_and_arch,
    argmax_policy_needs_a_model_level_measurement,
    leases_expire_and_no_job_completes_twice,
    many_submissions_with_four_workers,
    openapi_covers_every_route,
    submit_cli_waits_and_gates_on_policy,
    shape_exact_resolve_queues_and_runs_a_width_job,
    width_jobs_are_capped,
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
    assert_eq!(
        one["jobs"][0]["state"], "queued",
        "a bundled kernel is queued for verification"
    );
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
    assert!(
        p["detail"].as_str().unwrap().contains("64 lowercase hex"),
        "{p}"
    );
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
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("publish a new version"),
        "{p}"
    );
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
        let detail = p["detail"].as_str().unwrap_or_default();
        assert!(
            detail.contains(says),
            "{what}: detail `{detail}` lacks `{says}`"
        );
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
        assert!(
            p["detail"].as_str().unwrap_or_default().contains(says),
            "{path}: {p}"
        );
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
    let vs: Value = srv
        .get_json("/v1/kernels/e2e_exact/1.0.0/verifications")
        .await;
    assert_eq!(vs["verifications"].as_array().unwrap().len(), 1);
    let approved: Value = srv
        .get_json("/v1/kernels?policy=bit_exact&dtype=bf16&arch=sm_90")
        .await;
    assert_eq!(approved["total"], 1);
    let audit = support::audit_actions(&b, &srv.db_url).await;
    for a in ["kernel.created", "job.claimed", "verification.recorded"] {
        assert!(audit.iter().any(|x| x == a), "audit lacks {a}: {audit:?}");
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
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("keep your reference layer"),
        "{p}"
    );
    assert_eq!(p["excluded"].as_array().unwrap().len(), 3, "{p}");
}

async fn argmax_policy_needs_a_model_level_measurement(b: Backend) {
    let srv = TestServer::start(&b, &["--no-bundled"]).await;
    let submit = srv.token("submit");
    let worker = srv.token("worker");
    // Faster but measured per layer only, and slower with its argmax measured in a model.
    for (name, fixture) in [
        ("m_layer_only", EXACT_FASTEST),
        ("m_in_model", EXACT_WITH_MODEL),
    ] {
        let (m, s) = bundle_files(name, "1.0.0", "");
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
    assert_eq!(r["kernel"]["name"], "m_in_model", "{r}");
    let excluded = r["excluded"].to_string();
    assert!(
        excluded.contains("m_layer_only 1.0.0")
            && excluded.contains("no model-level (argmax) measurement for bf16"),
        "{excluded}"
    );
    // bit_exact does not look at the model: the faster one wins there.
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
    assert!(p["detail"].as_str().unwrap().contains("already complete"));
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
    let doc: Value = srv.get_json("/openapi.json").await;
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
    ] {
        assert!(
            paths.get(path).and_then(|p| p.get(method)).is_some(),
            "{method} {path} missing from /openapi.json"
        );
    }
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
            c["id"] = json!(format!("bf16/{rows}x{cols}/requested"));
            c["rows"] = json!(rows);
            c["cols"] = json!(cols);
            c["speed"] = Value::Null;
            r["cases"].as_array_mut().unwrap().push(c);
        }
        r["requested_shapes"] = claim["job"]["shapes"].clone();
    }
    r
}

/// Issue 13: a kernel verified at 4096 is not handed out at 11008; the request queues one
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

    // 11008 was never run: not handed out, and why; a job for exactly 11008 is queued.
    let (st, p) = srv.get(&q(11008, "")).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{p}");
    let why = p["excluded"][0].as_str().unwrap();
    assert!(
        why.starts_with("width_k 1.0.0: verified at cols 64, 127, 768")
            && why.contains("4096")
            && why.contains("for bf16 on sm_90, not at 11008"),
        "{why}"
    );
    let queued = p["queued_jobs"].as_array().unwrap();
    assert_eq!(queued.len(), 1, "{p}");
    assert_eq!(queued[0]["shape"], "11008:1..64");
    assert_eq!(queued[0]["new"], true);
    assert_eq!(queued[0]["digest"], sub["digest"]);
    let job_id = queued[0]["job_id"].as_i64().unwrap();
    assert_eq!(queued[0]["job_url"], format!("/v1/jobs/{job_id}"));
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains(&format!("/v1/jobs/{job_id}")),
        "{p}"
    );
    let job: Value = srv.get_json(&format!("/v1/jobs/{job_id}")).await;
    assert_eq!(job["state"], "queued");
    assert_eq!(
        job["shapes"],
        json!([{"cols": 11008, "rows_min": 1, "rows_max": 64}])
    );
    assert_eq!(job["width_cols"], 11008);

    // Asking again (with rows too) reuses the pending job: no duplicate.
    for rows in ["", "&rows=7", "&rows=512"] {
        let (st, p) = srv.get(&q(11008, rows)).await;
        assert_eq!(st, StatusCode::NOT_FOUND);
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
    let (st, html) = {
        let r = srv
            .client
            .get(srv.url("/policy?policy=bit_exact&dtype=bf16&arch=sm_90&cols=13824&op=rms_norm"))
            .send()
            .await
            .unwrap();
        (r.status(), r.text().await.unwrap())
    };
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
    let (st, p) = srv.get(&q(13824, "")).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
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
    assert_eq!(p["queued_jobs"][0]["shape"], format!("{}:1..1", max + 1));
}

/// Anonymous resolves queue work: at most `--max-pending-width-jobs` width jobs are pending;
/// beyond it the answer says so and queues nothing.
async fn width_jobs_are_capped(b: Backend) {
    let srv = TestServer::start(&b, &["--no-bundled", "--max-pending-width-jobs", "1"]).await;
    let submit = srv.token("submit");
    let worker = srv.token("worker");
    let (m, s) = rms_norm_files("capped_k");
    srv.post("/v1/kernels", &submit, &json!({"manifest": m, "source": s}))
        .await;
    support::claim_and_report(&srv, &worker, |claim| rms_report(claim, None)).await;
    let q = |cols: u64| {
        format!("/v1/resolve?op=rms_norm&semantics=llama&dtype=bf16&arch=sm_90&cols={cols}")
    };
    let (_, p) = srv.get(&q(11008)).await;
    assert_eq!(p["queued_jobs"].as_array().unwrap().len(), 1, "{p}");
    assert_eq!(p["queue_full"], Value::Null);
    let (st, p) = srv.get(&q(13824)).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
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
