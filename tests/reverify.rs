//! Re-verification across GPUs, on SQLite and PostgreSQL: jobs queued for an architecture go
//! only to workers that declare it, a report from another architecture is refused, verdicts of
//! an older suite or another driver are marked stale in the API, and `kernelize verify-request`
//! queues one kernel or every stale one.

mod support;

use reqwest::StatusCode;
use serde_json::{json, Value};
use support::{bundle_files, Backend, TestServer};

both_backends!(jobs_for_an_architecture_and_stale_verdicts);

fn kernelize(args: &[&str]) -> std::process::Output {
    std::process::Command::new(support::bin())
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

async fn jobs_for_an_architecture_and_stale_verdicts(b: Backend) {
    let srv = TestServer::start(&b, &["--no-bundled"]).await;
    let (submit, worker, admin) = (srv.token("submit"), srv.token("worker"), srv.token("admin"));
    // A kernel for sm_80 and sm_90, and one for sm_90 only.
    let (m, s) = bundle_files("both_archs", "1.0.0", "");
    let m = m.replace(r#"archs = ["sm_90"]"#, r#"archs = ["sm_80", "sm_90"]"#);
    assert_eq!(
        srv.post("/v1/kernels", &submit, &json!({"manifest": m, "source": s}))
            .await
            .0,
        StatusCode::CREATED
    );
    let (m, s) = bundle_files("hopper_only", "1.0.0", "");
    assert_eq!(
        srv.post("/v1/kernels", &submit, &json!({"manifest": m, "source": s}))
            .await
            .0,
        StatusCode::CREATED
    );
    let claim = |arch: Option<&str>| {
        let body = match arch {
            Some(a) => json!({"worker": "w", "arch": a}),
            None => json!({"worker": "w"}),
        };
        let (srv, worker) = (&srv, &worker);
        async move { srv.post("/v1/jobs/claim", worker, &body).await }
    };
    let report = |c: &Value, arch: &str| {
        let r = support::recorded_report("recorded/silu_and_mul", c, arch);
        let job = c["job"]["id"].as_i64().unwrap();
        let body = json!({"lease_id": c["lease_id"], "report": r});
        let (srv, worker) = (&srv, &worker);
        async move {
            srv.post(&format!("/v1/jobs/{job}/report"), worker, &body)
                .await
        }
    };

    // The jobs queued at submission are for any architecture; an sm_80 worker skips the
    // sm_90-only kernel's.
    let (st, c) = claim(Some("sm_80")).await;
    assert_eq!(st, StatusCode::OK, "{c}");
    assert!(c["kernel"]["manifest_toml"]
        .as_str()
        .unwrap()
        .contains("both_archs"));
    assert_eq!(
        claim(Some("sm_80")).await.0,
        StatusCode::NO_CONTENT,
        "hopper_only is not for sm_80"
    );
    assert_eq!(report(&c, "sm_80").await.0, StatusCode::CREATED);
    let (st, c) = claim(Some("sm_90")).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(report(&c, "sm_90").await.0, StatusCode::CREATED);

    // An admin queues both_archs on sm_90 again: once (a second request returns that job).
    let verify = |name: &'static str, arch: &'static str, token: &String| {
        let (srv, token) = (&srv, token.clone());
        async move {
            srv.post(
                &format!("/v1/kernels/{name}/1.0.0/verify"),
                &token,
                &json!({"arch": arch, "reason": "new driver"}),
            )
            .await
        }
    };
    assert_eq!(
        verify("both_archs", "sm_90", &submit).await.0,
        StatusCode::FORBIDDEN
    );
    let (st, q) = verify("both_archs", "sm_90", &admin).await;
    assert_eq!(st, StatusCode::CREATED, "{q}");
    assert_eq!(q["job"]["arch"], "sm_90");
    let (st, again) = verify("both_archs", "sm_90", &admin).await;
    assert_eq!((st, &again["job"]["id"]), (StatusCode::OK, &q["job"]["id"]));
    let (st, p) = verify("hopper_only", "sm_80", &admin).await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{p}");
    assert!(p["detail"].as_str().unwrap().contains("runs on sm_90 only"));
    // Only a worker declaring sm_90 gets it; one declaring none or sm_80 does not.
    assert_eq!(claim(None).await.0, StatusCode::NO_CONTENT);
    assert_eq!(claim(Some("sm_80")).await.0, StatusCode::NO_CONTENT);
    let (st, c) = claim(Some("sm_90")).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(c["job"]["id"], q["job"]["id"]);
    // Its report must come from an sm_90 GPU.
    let (st, p) = report(&c, "sm_80").await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{p}");
    assert_eq!(p["field"], "report.device.arch");
    // Measured with a newer driver: the earlier sm_90 verdicts become stale by driver.
    let mut r = support::recorded_report("recorded/silu_and_mul", &c, "sm_90");
    r["device"]["driver_version"] = json!("590.10.01");
    let job = c["job"]["id"].as_i64().unwrap();
    let (st, done) = srv
        .post(
            &format!("/v1/jobs/{job}/report"),
            &worker,
            &json!({"lease_id": c["lease_id"], "report": r}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{done}");

    let stale_of = |name: &'static str, arch: &'static str| {
        let srv = &srv;
        async move {
            let (_, vs) = srv
                .get(&format!("/v1/kernels/{name}/1.0.0/verifications"))
                .await;
            vs["verifications"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["arch"] == arch)
                .map(|v| {
                    v["stale"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|s| s.as_str().unwrap().to_string())
                        .collect::<Vec<_>>()
                })
                .unwrap()
        }
    };
    // Every recorded report is of an older suite than this verifier's: stale by suite.
    let newest = stale_of("both_archs", "sm_90").await;
    assert_eq!(newest.len(), 1, "{newest:?}");
    assert!(newest[0].contains("measured by suite 2026.1"), "{newest:?}");
    let older = stale_of("hopper_only", "sm_90").await;
    assert!(
        older.iter().any(|w| w
            .contains("driver 580.159.04; the newest verification on sm_90 ran driver 590.10.01")),
        "{older:?}"
    );
    // Resolve says it too.
    let (st, r) = srv
        .get("/v1/resolve?op=silu&dtype=bf16&arch=sm_80&cols=4096&policy=bit_exact")
        .await;
    assert_eq!(st, StatusCode::OK, "{r}");
    assert!(r["stale"][0].as_str().unwrap().contains("suite"), "{r}");

    // verify-request: one kernel, then every stale one on sm_90.
    let one = kernelize(&[
        "verify-request",
        "hopper_only",
        "1.0.0",
        "--arch",
        "sm_90",
        "--server",
        &srv.url(""),
        "--token",
        &admin,
    ]);
    assert!(
        one.status.success(),
        "{}",
        String::from_utf8_lossy(&one.stderr)
    );
    assert!(String::from_utf8_lossy(&one.stdout).contains("queued"));
    let all = kernelize(&[
        "verify-request",
        "--stale",
        "--arch",
        "sm_90",
        "--reason",
        "suite 2026.3",
        "--server",
        &srv.url(""),
        "--token",
        &admin,
    ]);
    let out = String::from_utf8_lossy(&all.stdout);
    assert!(
        all.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&all.stderr)
    );
    assert!(
        out.contains("hopper_only 1.0.0 on sm_90: job") && out.contains("already pending"),
        "{out}"
    );
    assert!(
        out.contains("both_archs 1.0.0 on sm_90: job") && out.contains("queued"),
        "{out}"
    );
    let audit = support::audit_actions(&b, &srv.db_url).await;
    assert_eq!(
        audit.iter().filter(|a| *a == "job.queued_for_arch").count(),
        3
    );
}
