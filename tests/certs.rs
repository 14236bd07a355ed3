//! Signed verification certificates end to end, on SQLite and PostgreSQL: a worker key made
//! and registered with the CLI, a signed report stored and served with its certificate, which
//! `kernelize cert verify` checks offline; unregistered keys, tampered reports, another job's
//! kernel and, by default (without `--accept-unsigned-reports`), unsigned reports refused; a
//! certificate bound to its job and claim (issue 26), a valid one replayed for another job
//! refused and audited, never stored nor counted twice.

mod support;

use kernel_registry::cert::{self, Certificate, Claims};
use kernel_registry::VerificationReport;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::process::Command;
use support::{bin, bundle_files, detail, Backend, TestServer};

both_backends!(
    signed_reports_are_stored_served_and_checked_offline,
    bundled_certificates_make_a_fresh_hub_answer,
    a_fresh_hub_queues_nothing_for_kernels_its_certificates_cover,
    the_bundled_certificates_carry_the_model_level,
    a_backward_kernel_resolves_for_the_gpu_shape_it_was_verified_on,
    confirmed_asks_for_independent_worker_keys,
    certificates_are_bound_to_their_job_and_claim
);

fn kernelize(args: &[&str]) -> std::process::Output {
    Command::new(bin())
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

/// The report a worker posts for `claim`, with the summary its cases give (as the hub derives
/// it), signed by `key` when given, for the claim's job and nonce (as a worker signs).
fn signed_report(claim: &Value, key: Option<&ed25519_dalek::SigningKey>) -> (Value, Value) {
    let job = claim["job"]["id"].as_i64().unwrap();
    let nonce = claim["nonce"].as_str().expect("a claim hands out a nonce");
    signed_report_with("recorded/silu_and_mul", claim, key, |r| {
        Claims::for_job(r, "2026-11-23T08:30:00Z", job, nonce)
    })
}

/// `recorded` for `claim`, signed by `key` with claims bound to no job (format /1, as
/// `kernelize cert sign` writes for bundled certificates).
fn signed_report_of(
    recorded: &str,
    claim: &Value,
    key: Option<&ed25519_dalek::SigningKey>,
) -> (Value, Value) {
    signed_report_with(recorded, claim, key, |r| {
        Claims::of(r, "2026-11-23T08:30:00Z")
    })
}

fn signed_report_with(
    recorded: &str,
    claim: &Value,
    key: Option<&ed25519_dalek::SigningKey>,
    claims: impl Fn(&VerificationReport) -> Claims,
) -> (Value, Value) {
    let v = support::recorded_report(recorded, claim, "sm_90");
    let mut report: VerificationReport = serde_json::from_value(v).unwrap();
    kernel_registry::report::rederive(&mut report);
    let cert = key.map(|k| serde_json::to_value(Certificate::sign(k, &claims(&report))).unwrap());
    (
        serde_json::to_value(&report).unwrap(),
        cert.unwrap_or(Value::Null),
    )
}

async fn signed_reports_are_stored_served_and_checked_offline(b: Backend) {
    let srv = TestServer::start(&b, &["--no-bundled"]).await;
    let submit = srv.token("submit");
    let worker = srv.token("worker");
    for i in 0..5 {
        let (m, s) = bundle_files(&format!("cert_k{i}"), "1.0.0", "");
        let (st, _) = srv
            .post("/v1/kernels", &submit, &json!({"manifest": m, "source": s}))
            .await;
        assert_eq!(st, StatusCode::CREATED);
    }
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("w.key");
    let key_path = key_file.to_str().unwrap();

    // The worker makes a key (mode 0600, kept on a second init); the admin registers it.
    let out = kernelize(&["worker-key", "init", "--file", key_path]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let public = String::from_utf8(out.stdout).unwrap().trim().to_string();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&key_file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let again = kernelize(&["worker-key", "init", "--file", key_path]);
    assert_eq!(String::from_utf8(again.stdout).unwrap().trim(), public);
    let reg = kernelize(&[
        "worker-key",
        "register",
        "--name",
        "gpu0",
        "--key-file",
        key_path,
        "--db",
        &srv.db_url,
    ]);
    assert!(
        reg.status.success(),
        "{}",
        String::from_utf8_lossy(&reg.stderr)
    );
    let twice = kernelize(&[
        "worker-key",
        "register",
        "--name",
        "gpu0-again",
        "--public-key",
        &public,
        "--db",
        &srv.db_url,
    ]);
    assert!(!twice.status.success());
    assert!(String::from_utf8_lossy(&twice.stderr).contains("registered already as `gpu0`"));
    let list = kernelize(&["worker-key", "list", "--db", &srv.db_url]);
    assert!(String::from_utf8_lossy(&list.stdout).contains(&public));
    let key = cert::decode_signing_key(&std::fs::read_to_string(&key_file).unwrap()).unwrap();

    let claim = || async {
        let (st, c) = srv
            .post("/v1/jobs/claim", &worker, &json!({"worker": "w"}))
            .await;
        assert_eq!(st, StatusCode::OK, "{c}");
        c
    };
    let post = |c: &Value, report: &Value, certificate: &Value| {
        let job = c["job"]["id"].as_i64().unwrap();
        let body = json!({"lease_id": c["lease_id"], "report": report, "certificate": certificate});
        let srv = &srv;
        let worker = &worker;
        async move {
            srv.post(&format!("/v1/jobs/{job}/report"), worker, &body)
                .await
        }
    };

    // 1. Signed by the registered key: stored, served with its certificate, checked offline.
    let c = claim().await;
    let (report, certificate) = signed_report(&c, Some(&key));
    let (st, r) = post(&c, &report, &certificate).await;
    assert_eq!(st, StatusCode::CREATED, "{r}");
    let (st, v) = srv.get(r["url"].as_str().unwrap()).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(v["certificate"], certificate);
    let served = dir.path().join("verification.json");
    std::fs::write(&served, serde_json::to_string(&v).unwrap()).unwrap();
    let served = served.to_str().unwrap();
    let ok = kernelize(&["cert", "verify", served, "--trust", &public]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).starts_with("certificate OK"));
    // Offline, a changed figure, an untrusted signer and no trusted key at all are refused.
    let mut tampered = v.clone();
    tampered["report"]["cases"][0]["exactness"]["mismatches"] = json!(1);
    let t = dir.path().join("tampered.json");
    std::fs::write(&t, serde_json::to_string(&tampered).unwrap()).unwrap();
    let bad = kernelize(&["cert", "verify", t.to_str().unwrap(), "--trust", &public]);
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("not the one certified"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    let other = cert::encode_key(&ed25519_dalek::SigningKey::from_bytes(&[3; 32]).verifying_key());
    let untrusted = kernelize(&["cert", "verify", served, "--trust", &other]);
    assert!(!untrusted.status.success());
    assert!(String::from_utf8_lossy(&untrusted.stderr).contains("not among the trusted keys"));
    assert!(!kernelize(&["cert", "verify", served]).status.success());

    // 2. Signed by a key the hub does not know: 403, and the job stays the worker's.
    let c = claim().await;
    let stranger = ed25519_dalek::SigningKey::from_bytes(&[5; 32]);
    let (report, certificate) = signed_report(&c, Some(&stranger));
    let (st, p) = post(&c, &report, &certificate).await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{p}");
    assert_eq!(p["field"], "certificate");
    assert!(detail(&p).contains("not registered"));
    // 3. Signed, then a figure changed: 422.
    let (mut report, certificate) = signed_report(&c, Some(&key));
    report["duration_s"] = json!(report["duration_s"].as_f64().unwrap() + 1.0);
    let (st, p) = post(&c, &report, &certificate).await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{p}");
    assert!(detail(&p).contains("not the one certified"), "{p}");
    // 4. A certificate of another job's report (another kernel) does not carry over.
    let c2 = claim().await;
    let (report2, _) = signed_report(&c2, None);
    let (_, certificate_of_c) = signed_report(&c, Some(&key));
    let (st, p) = post(&c2, &report2, &certificate_of_c).await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{p}");
    // The honest report of job c still goes through; unsigned is accepted by a hub run with --accept-unsigned-reports (as here).
    let (report, certificate) = signed_report(&c, Some(&key));
    assert_eq!(post(&c, &report, &certificate).await.0, StatusCode::CREATED);
    assert_eq!(
        post(&c2, &report2, &Value::Null).await.0,
        StatusCode::CREATED
    );
    drop(srv);

    let db_url = match &b {
        Backend::Sqlite(_) => b.url(),
        Backend::Postgres(u) => u.clone(),
    };
    // 6. A hub as it runs by default refuses unsigned reports (signed by a key registered
    // anew: gpu0 is revoked).
    let fresh = ed25519_dalek::SigningKey::from_bytes(&[13; 32]);
    let reg = kernelize(&[
        "worker-key",
        "register",
        "--name",
        "gpu1",
        "--public-key",
        &cert::encode_key(&fresh.verifying_key()),
        "--db",
        &db_url,
    ]);
    assert!(
        reg.status.success(),
        "{}",
        String::from_utf8_lossy(&reg.stderr)
    );
    let strict = TestServer::start_on(&b, &db_url, &["--no-bundled", "--signed-only"]).await;
    let worker = strict.token("worker");
    let (st, c) = strict
        .post("/v1/jobs/claim", &worker, &json!({"worker": "w"}))
        .await;
    assert_eq!(st, StatusCode::OK, "{c}");
    let (report, _) = signed_report(&c, None);
    let job = c["job"]["id"].as_i64().unwrap();
    let (st, p) = strict
        .post(
            &format!("/v1/jobs/{job}/report"),
            &worker,
            &json!({"lease_id": c["lease_id"], "report": report}),
        )
        .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{p}");
    assert!(detail(&p).contains("only signed reports"));
    let (_, certificate) = signed_report(&c, Some(&fresh));
    let (st, p) = strict
        .post(
            &format!("/v1/jobs/{job}/report"),
            &worker,
            &json!({"lease_id": c["lease_id"], "report": report, "certificate": certificate}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{p}");
}

/// A kernels folder holding one bundled kernel and `certificates/` with a verification of it
/// signed by `key` (and the key trusted), as the project ships its GPU runs' certificates.
fn kernels_with_certificate(dir: &std::path::Path, key: &ed25519_dalek::SigningKey) -> Value {
    let src = support::kernels_dir().join("rms_norm_llama");
    let dst = dir.join("rms_norm_llama");
    std::fs::create_dir_all(&dst).unwrap();
    for f in ["kernel.toml", "kernel.cu"] {
        std::fs::copy(src.join(f), dst.join(f)).unwrap();
    }
    let bundle = kernel_registry::KernelBundle::load_dir(&dst).unwrap();
    let claim = json!({
        "kernel": {"manifest_toml": std::fs::read_to_string(dst.join("kernel.toml")).unwrap(),
                   "digest": bundle.digest()},
        "job": {"shapes": []},
    });
    let (report, certificate) = signed_report_of("recorded/rms_norm_llama", &claim, Some(key));
    let served = json!({"id": 7, "report": report, "certificate": certificate});
    let certs = dir.join("certificates");
    std::fs::create_dir_all(certs.join("sm_90")).unwrap();
    std::fs::write(
        certs.join("trusted-keys.txt"),
        format!(
            "# the project's GPU runs\n{}\n",
            cert::encode_key(&key.verifying_key())
        ),
    )
    .unwrap();
    std::fs::write(
        certs.join("sm_90/rms_norm_llama.json"),
        serde_json::to_string(&served).unwrap(),
    )
    .unwrap();
    served
}

async fn bundled_certificates_make_a_fresh_hub_answer(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let key = ed25519_dalek::SigningKey::from_bytes(&[11; 32]);
    let served = kernels_with_certificate(dir.path(), &key);
    let kernels = dir.path().to_str().unwrap();
    let resolve =
        "/v1/resolve?op=rms_norm&semantics=llama&dtype=bf16&arch=sm_90&cols=4096&policy=bit_exact";
    let db_url = b.url();
    let version = served["report"]["kernel"]["version"]
        .as_str()
        .unwrap()
        .to_string();
    {
        let srv = TestServer::start(&b, &["--kernels", kernels]).await;
        let (st, r) = srv.get(resolve).await;
        assert_eq!(st, StatusCode::OK, "{r}");
        assert_eq!(r["kernel"]["name"], "rms_norm_llama");
        let (_, v) = srv
            .get(&format!("/v1/verifications/{}", r["verification_id"]))
            .await;
        assert_eq!(v["job_id"], Value::Null, "imported, not a job of this hub");
        assert_eq!(v["certificate"], served["certificate"]);
        let page = reqwest::get(srv.url(&format!("/kernels/rms_norm_llama/{version}")))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(page.contains("imported: recorded on the project"), "{page}");
        // The imported verification covers the kernel: no suite job is queued for it (issue 27
        // item 4), so a worker finds nothing to claim.
        assert_eq!(support::job_count(&srv.db_url).await, 0);
        let worker = srv.token("worker");
        let (st, c) = srv
            .post(
                "/v1/jobs/claim",
                &worker,
                &json!({"worker": "local", "arch": "sm_90"}),
            )
            .await;
        assert_eq!(st, StatusCode::NO_CONTENT, "{c}");
        // A local worker's verdict (asked for by an admin) supersedes the imported one.
        let admin = srv.token("admin");
        let (st, q) = srv
            .post(
                &format!("/v1/kernels/rms_norm_llama/{version}/verify"),
                &admin,
                &json!({"arch": "sm_90", "reason": "a local run"}),
            )
            .await;
        assert_eq!(st, StatusCode::CREATED, "{q}");
        let (st, c) = srv
            .post(
                "/v1/jobs/claim",
                &worker,
                &json!({"worker": "local", "arch": "sm_90"}),
            )
            .await;
        assert_eq!(st, StatusCode::OK, "{c}");
        let local = support::recorded_report("recorded/rms_norm_llama", &c, "sm_90");
        let job = c["job"]["id"].as_i64().unwrap();
        let (st, done) = srv
            .post(
                &format!("/v1/jobs/{job}/report"),
                &worker,
                &json!({"lease_id": c["lease_id"], "report": local}),
            )
            .await;
        assert_eq!(st, StatusCode::CREATED, "{done}");
        let (_, again) = srv.get(resolve).await;
        assert_eq!(again["verification_id"], done["verification_id"], "{again}");
    }
    // A restart imports nothing twice; a tampered file is refused, not imported.
    let f = dir.path().join("certificates/sm_90/rms_norm_llama.json");
    let mut tampered = served.clone();
    tampered["report"]["duration_s"] = json!(1.0);
    std::fs::write(
        dir.path().join("certificates/sm_90/tampered.json"),
        serde_json::to_string(&tampered).unwrap(),
    )
    .unwrap();
    assert!(f.exists());
    let srv = TestServer::start_on(&b, &db_url, &["--kernels", kernels]).await;
    let (_, list) = srv
        .get(&format!(
            "/v1/kernels/rms_norm_llama/{version}/verifications"
        ))
        .await;
    // The imported one (not twice) and the local worker's.
    assert_eq!(
        list["verifications"].as_array().map(Vec::len),
        Some(2),
        "{list}"
    );
    let actions = support::audit_actions(&b, &db_url).await;
    assert_eq!(
        actions
            .iter()
            .filter(|a| *a == "verification.imported")
            .count(),
        1
    );
}

/// A fresh hub (`kernelize serve` on an empty database with the repository's bundled kernels
/// and certificates) queues no job for a kernel an imported verification covers, on start and
/// on restart; a kernel without one still gets its suite job.
async fn a_fresh_hub_queues_nothing_for_kernels_its_certificates_cover(b: Backend) {
    let db_url = b.url();
    for start in ["fresh", "restart"] {
        let srv = TestServer::start_on(&b, &db_url, &[]).await;
        let list = srv.get_json("/v1/kernels?limit=500").await;
        let kernels = list["kernels"].as_array().expect("a kernel list").clone();
        assert!(kernels.len() >= 16, "{start}: {list}");
        let (mut covered, mut queued) = (0, 0);
        for k in &kernels {
            let (name, version) = (k["name"].as_str().unwrap(), k["version"].as_str().unwrap());
            let vs = srv
                .get_json(&format!("/v1/kernels/{name}/{version}/verifications"))
                .await;
            let imported = vs["verifications"]
                .as_array()
                .unwrap()
                .iter()
                .any(|v| v.get("job_id") == Some(&Value::Null));
            let one = srv.get_json(&format!("/v1/kernels/{name}/{version}")).await;
            let jobs = one["jobs"].as_array().unwrap();
            if imported {
                covered += 1;
                assert!(
                    jobs.is_empty(),
                    "{start}: {name} {version} is covered: {one}"
                );
            } else {
                queued += jobs.len();
                assert_eq!(jobs.len(), 1, "{start}: {name} {version}: {one}");
            }
        }
        assert!(
            covered >= 16,
            "{start}: {covered} kernels covered by certificates"
        );
        assert_eq!(
            support::job_count(&db_url).await,
            queued as i64,
            "{start}: only kernels without a certificate have a job"
        );
    }
    // Without the certificates every bundled kernel has its suite job queued.
    let other = match &b {
        Backend::Sqlite(_) => Backend::sqlite(),
        Backend::Postgres(_) => Backend::postgres().await.expect("a PostgreSQL server"),
    };
    let srv = TestServer::start(&other, &["--no-bundled-certificates"]).await;
    let list = srv.get_json("/v1/kernels?limit=500").await;
    let n = list["kernels"].as_array().unwrap().len() as i64;
    assert!(n >= 16, "{list}");
    assert_eq!(support::job_count(&srv.db_url).await, n);
}

/// Issue 27: the committed certificates carry the model-level measurements (recorded with the
/// shipped models, `GPU_CERTS_MODELS=1 scripts/gpu-certs`), so a fresh hub answers the `argmax`
/// policy out of the box: every forward kernel's imported report says what its model level did
/// (measured, or why a model has no layer of its op), and under `argmax` the bundled kernels that
/// are not bit-exact (which qualify only through a measurement) are handed out where `bit_exact`
/// excludes them.
async fn the_bundled_certificates_carry_the_model_level(b: Backend) {
    let srv = TestServer::start(&b, &[]).await;
    let list = srv.get_json("/v1/kernels?limit=500").await;
    let mut measured = 0;
    for k in list["kernels"].as_array().unwrap() {
        let (name, version) = (k["name"].as_str().unwrap(), k["version"].as_str().unwrap());
        let vs = srv
            .get_json(&format!("/v1/kernels/{name}/{version}/verifications"))
            .await;
        let Some(v) = vs["verifications"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["job_id"] == Value::Null)
        else {
            continue;
        };
        let full = srv
            .get_json(&format!("/v1/verifications/{}", v["id"]))
            .await;
        let report = &full["report"];
        let notes = report["model_notes"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(
            !notes.is_empty(),
            "{name} {version}: the bundled certificate's report has no model-level part: {report}"
        );
        let models = report["model"].as_array().map(Vec::len).unwrap_or(0);
        if k["op"].as_str().unwrap().ends_with("_backward") {
            assert_eq!(models, 0, "{name}: a backward op has no model level yet");
            continue;
        }
        // Measured, or each shipped model said not to have a layer of the op.
        let not_measured = notes
            .iter()
            .filter(|n| n.as_str().unwrap().contains("not measured"))
            .count();
        assert!(
            models > 0 || not_measured >= 2,
            "{name} {version}: neither measured nor said why: {notes:?}"
        );
        measured += usize::from(models > 0);
    }
    assert!(
        measured >= 12,
        "{measured} bundled kernels measured in a model"
    );
    for (q, inexact) in [
        (
            "op=rms_norm&semantics=llama&dtype=bf16",
            "rms_norm_llama_wbr",
        ),
        ("op=silu_and_mul&dtype=bf16", "silu_and_mul_fused"),
        ("op=silu&dtype=f16", "silu_fastmath"),
    ] {
        let ask = |policy: &str| format!("/v1/resolve?{q}&arch=sm_90&cols=4096&policy={policy}");
        let mentions = |r: &Value, key: &str| {
            r[key]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e.as_str().unwrap().starts_with(&format!("{inexact} ")))
        };
        let (st, exact) = srv.get(&ask("bit_exact")).await;
        assert_eq!(st, StatusCode::OK, "{exact}");
        assert!(
            mentions(&exact, "excluded"),
            "{q}: bit_exact excludes {inexact}: {exact}"
        );
        let (st, weak) = srv.get(&ask("argmax")).await;
        assert_eq!(st, StatusCode::OK, "{weak}");
        assert_eq!(
            weak["excluded"],
            json!([]),
            "{q}: argmax excludes nothing: {weak}"
        );
        assert!(
            weak["kernel"]["name"] == inexact || mentions(&weak, "also_qualifying"),
            "{q}: {inexact} qualifies under argmax through its model-level measurement: {weak}"
        );
    }
}

/// Issue 30: the bundled backward kernel's certificate was recorded on an H200 (132 SMs x 2048
/// threads per SM). A resolve of the backward op that names the asking GPU's figures
/// (`sms`, `threads_per_sm`) gets it only for those figures; one that names none gets it
/// unchecked (the Python client checks them itself); the two go together, and only with a
/// backward op.
async fn a_backward_kernel_resolves_for_the_gpu_shape_it_was_verified_on(b: Backend) {
    let srv = TestServer::start(&b, &[]).await;
    let ask = |extra: &str| {
        format!("/v1/resolve?op=rms_norm_backward&semantics=llama&dtype=bf16&arch=sm_90&cols=256{extra}")
    };
    for extra in ["", "&sms=132&threads_per_sm=2048"] {
        let (st, r) = srv.get(&ask(extra)).await;
        assert_eq!(st, StatusCode::OK, "{extra}: {r}");
        assert_eq!(r["kernel"]["name"], "rms_norm_llama_backward", "{r}");
        // the answer names the figures the verdict holds for
        assert_eq!(
            (&r["device_sm_count"], &r["device_threads_per_sm"]),
            (&json!(132), &json!(2048)),
            "{r}"
        );
    }
    for (sms, tps) in [(114, 2048), (132, 1536)] {
        let (st, r) = srv
            .get(&ask(&format!("&sms={sms}&threads_per_sm={tps}")))
            .await;
        assert_eq!(st, StatusCode::NOT_FOUND, "{r}");
        let line = r["excluded"][0].as_str().unwrap_or_default();
        assert!(
            line.starts_with("rms_norm_llama_backward ")
                && line
                    .contains(": verified on a GPU of 132 SMs x 2048 threads per SM (NVIDIA H200)")
                && line.contains(&format!("asks for {sms} x {tps}")),
            "{r}"
        );
    }
    for (extra, field) in [
        ("&sms=132", "sms"),
        ("&threads_per_sm=2048", "sms"),
        ("&sms=0&threads_per_sm=2048", "sms"),
    ] {
        let (st, r) = srv.get(&ask(extra)).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{extra}: {r}");
        assert_eq!(r["field"], field, "{r}");
    }
    let (st, r) = srv
        .get("/v1/resolve?op=rms_norm&semantics=llama&dtype=bf16&arch=sm_90&cols=256&sms=132&threads_per_sm=2048")
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{r}");
    assert!(detail(&r).contains("apply to backward ops"), "{r}");
    // silu_mul_backward takes the figures too (a client may send its GPU's with every backward
    // op) and is not restricted by them (elementwise): its certificate was recorded on 132 SMs
    // and it resolves for a GPU of 114, with no line about SMs
    let (st, r) = srv
        .get("/v1/resolve?op=silu_mul_backward&dtype=bf16&arch=sm_90&cols=256&sms=114&threads_per_sm=2048")
        .await;
    assert_eq!(st, StatusCode::OK, "{r}");
    assert_eq!(r["kernel"]["name"], "silu_mul_backward", "{r}");
    assert_eq!(r["class"], "bit_exact", "{r}");
    assert_eq!(r["device_sm_count"], 132, "{r}");
    assert!(!r["excluded"].to_string().contains("SMs"), "{r}");
    // so is layer_norm_backward (its column sum's order depends on the rows alone, up to the
    // 65536 it takes)
    let (st, r) = srv
        .get("/v1/resolve?op=layer_norm_backward&dtype=f32&arch=sm_90&cols=768&sms=114&threads_per_sm=2048")
        .await;
    assert_eq!(st, StatusCode::OK, "{r}");
    assert_eq!(r["kernel"]["name"], "layer_norm_backward", "{r}");
    assert_eq!(r["class"], "bit_exact", "{r}");
    assert!(!r["excluded"].to_string().contains("SMs"), "{r}");
}

/// `confirmed:N`: N different worker keys must certify the class on the architecture.
async fn confirmed_asks_for_independent_worker_keys(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let (k1, k2) = (
        ed25519_dalek::SigningKey::from_bytes(&[21; 32]),
        ed25519_dalek::SigningKey::from_bytes(&[22; 32]),
    );
    let served = kernels_with_certificate(dir.path(), &k1);
    let kernels = dir.path().to_str().unwrap();
    let resolve = |policy: &str| {
        format!("/v1/resolve?op=rms_norm&semantics=llama&dtype=bf16&arch=sm_90&cols=4096&policy={policy}")
    };
    let db_url = b.url();
    {
        let srv = TestServer::start(&b, &["--kernels", kernels]).await;
        assert_eq!(
            srv.get(&resolve("bit_exact,confirmed:1")).await.0,
            StatusCode::OK
        );
        let (st, r) = srv.get(&resolve("bit_exact,confirmed:2")).await;
        assert_eq!(st, StatusCode::NOT_FOUND, "{r}");
        let why = r["excluded"].to_string();
        assert!(
            why.contains("1 worker key(s) certify class bit_exact on sm_90, the policy asks for 2"),
            "{why}"
        );
    }
    // A second worker, with its own key, confirms the same verdict.
    let report: VerificationReport = serde_json::from_value(served["report"].clone()).unwrap();
    let second = Certificate::sign(&k2, &Claims::of(&report, "2026-11-23T09:00:00Z"));
    let certs = dir.path().join("certificates");
    std::fs::write(
        certs.join("sm_90/rms_norm_llama-second-worker.json"),
        serde_json::to_string(&json!({"report": report, "certificate": second})).unwrap(),
    )
    .unwrap();
    let keys = std::fs::read_to_string(certs.join("trusted-keys.txt")).unwrap();
    std::fs::write(
        certs.join("trusted-keys.txt"),
        format!("{keys}{}\n", cert::encode_key(&k2.verifying_key())),
    )
    .unwrap();
    let srv = TestServer::start_on(&b, &db_url, &["--kernels", kernels]).await;
    let (st, r) = srv.get(&resolve("bit_exact,confirmed:2")).await;
    assert_eq!(st, StatusCode::OK, "{r}");
    let (st, r) = srv.get(&resolve("bit_exact,confirmed:3")).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{r}");
    // The approved list agrees with resolve.
    let listed = |policy: &'static str| {
        let srv = &srv;
        async move {
            let (_, l) = srv
                .get(&format!(
                    "/v1/kernels?op=rms_norm&arch=sm_90&policy={policy}"
                ))
                .await;
            l["total"].as_i64().unwrap()
        }
    };
    assert_eq!(listed("bit_exact,confirmed:2").await, 1);
    assert_eq!(listed("bit_exact,confirmed:3").await, 0);
    // One local run cannot show confirmations.
    let v = kernelize(&["verify", kernels, "--policy", "bit_exact,confirmed:2"]);
    assert!(!v.status.success());
    assert!(String::from_utf8_lossy(&v.stderr).contains("which one run cannot show"));
    // Unsigned verdicts confirm nothing: a policy without confirmed: still resolves.
    assert_eq!(srv.get(&resolve("bit_exact")).await.0, StatusCode::OK);
}

/// A worker token named `name`, made with the CLI.
fn worker_token(db_url: &str, name: &str) -> String {
    let out = kernelize(&[
        "token", "create", "--scope", "worker", "--name", name, "--db", db_url,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Register `key`'s public key as worker key `name`.
fn register_key(db_url: &str, name: &str, key: &ed25519_dalek::SigningKey) {
    let reg = kernelize(&[
        "worker-key",
        "register",
        "--name",
        name,
        "--public-key",
        &cert::encode_key(&key.verifying_key()),
        "--db",
        db_url,
    ]);
    assert!(
        reg.status.success(),
        "{}",
        String::from_utf8_lossy(&reg.stderr)
    );
}

/// Issue 26: each claim hands out a fresh nonce, and a report's certificate must name its job
/// and that nonce. The public report and certificate of one verification, posted unchanged
/// with another worker token to a new job of the same kernel, is refused (403, audited) and
/// nothing is stored, so it never counts towards `confirmed:N`; so are an unbound (/1)
/// certificate and one naming the job but another claim's nonce. The second worker's own
/// certificate then counts as a second key.
async fn certificates_are_bound_to_their_job_and_claim(b: Backend) {
    let srv = TestServer::start(&b, &["--no-bundled", "--signed-only"]).await;
    let (submit, admin) = (srv.token("submit"), srv.token("admin"));
    let (alice, mallory) = (
        worker_token(&srv.db_url, "gpu-alice"),
        worker_token(&srv.db_url, "gpu-mallory"),
    );
    let (ka, km) = (
        ed25519_dalek::SigningKey::from_bytes(&[31; 32]),
        ed25519_dalek::SigningKey::from_bytes(&[32; 32]),
    );
    register_key(&srv.db_url, "alice", &ka);
    register_key(&srv.db_url, "mallory", &km);
    let (m, s) = bundle_files("replayed_k", "1.0.0", "");
    let (st, r) = srv
        .post("/v1/kernels", &submit, &json!({"manifest": m, "source": s}))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{r}");
    let claim = |token: &String| {
        let (srv, token) = (&srv, token.clone());
        async move {
            let (st, c) = srv
                .post(
                    "/v1/jobs/claim",
                    &token,
                    &json!({"worker": "w", "arch": "sm_90"}),
                )
                .await;
            assert_eq!(st, StatusCode::OK, "{c}");
            c
        }
    };
    let post = |token: &String, c: &Value, report: &Value, certificate: &Value| {
        let job = c["job"]["id"].as_i64().unwrap();
        let body = json!({"lease_id": c["lease_id"], "report": report, "certificate": certificate});
        let (srv, token) = (&srv, token.clone());
        async move {
            srv.post(&format!("/v1/jobs/{job}/report"), &token, &body)
                .await
        }
    };
    let resolve = |n: u32| {
        let srv = &srv;
        async move {
            srv.get(&format!(
                "/v1/resolve?op=silu&dtype=bf16&arch=sm_90&cols=4096&policy=bit_exact,confirmed:{n}"
            ))
            .await
        }
    };

    // 1. Alice verifies job 1: the claim's nonce (128 bits, hex) is hers alone, not in the
    // public job; her certificate names the job and the nonce, and is stored.
    let c1 = claim(&alice).await;
    let (job1, nonce1) = (
        c1["job"]["id"].as_i64().unwrap(),
        c1["nonce"].as_str().unwrap().to_string(),
    );
    assert!(
        nonce1.len() == 32 && nonce1.chars().all(|c| c.is_ascii_hexdigit()),
        "{nonce1}"
    );
    let public = srv.get_json(&format!("/v1/jobs/{job1}")).await;
    assert!(!public.to_string().contains(&nonce1), "{public}");
    let (report1, cert1) = signed_report(&c1, Some(&ka));
    let (st, r) = post(&alice, &c1, &report1, &cert1).await;
    assert_eq!(st, StatusCode::CREATED, "{r}");
    let served = srv.get_json(r["url"].as_str().unwrap()).await;
    let claims: Value =
        serde_json::from_str(served["certificate"]["claims"].as_str().unwrap()).unwrap();
    assert_eq!(claims["format"], cert::FORMAT_JOB);
    assert_eq!(
        (claims["job_id"].as_i64(), claims["nonce"].as_str()),
        (Some(job1), Some(nonce1.as_str()))
    );
    assert_eq!(resolve(1).await.0, StatusCode::OK);

    // 2. An admin queues the kernel again; Mallory claims that job 2 with her own token.
    let (st, q) = srv
        .post(
            "/v1/kernels/replayed_k/1.0.0/verify",
            &admin,
            &json!({"arch": "sm_90", "reason": "confirmation"}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{q}");
    let c2 = claim(&mallory).await;
    let (job2, nonce2) = (
        c2["job"]["id"].as_i64().unwrap(),
        c2["nonce"].as_str().unwrap().to_string(),
    );
    assert_eq!(job2, q["job"]["id"].as_i64().unwrap());
    assert_ne!(nonce2, nonce1, "a new claim gets a new nonce");

    // 3. She posts Alice's public report and certificate unchanged: refused, audited.
    let report_served = served["report"].clone();
    let (st, p) = post(&mallory, &c2, &report_served, &served["certificate"]).await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{p}");
    assert_eq!(p["field"], "certificate");
    let d = detail(&p);
    assert!(
        d.contains(&format!("names job {job1}, this is job {job2}")) && d.contains("claim the job"),
        "{d}"
    );
    // 4. Alice's report with an unbound (/1) certificate, signed by Mallory's own registered
    // key: refused too (such certificates are for imports only).
    let mut r1: VerificationReport = serde_json::from_value(report_served.clone()).unwrap();
    kernel_registry::report::rederive(&mut r1);
    let unbound = serde_json::to_value(Certificate::sign(
        &km,
        &Claims::of(&r1, "2026-11-27T00:00:00Z"),
    ))
    .unwrap();
    let (st, p) = post(&mallory, &c2, &report_served, &unbound).await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{p}");
    assert!(detail(&p).contains("names no job"), "{p}");
    // 5. Named for job 2 but with job 1's nonce (another claim): refused.
    let stale = serde_json::to_value(Certificate::sign(
        &km,
        &Claims::for_job(&r1, "2026-11-27T00:00:00Z", job2, &nonce1),
    ))
    .unwrap();
    let (st, p) = post(&mallory, &c2, &report_served, &stale).await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{p}");
    assert!(detail(&p).contains("another claim"), "{p}");

    // Nothing was stored: one verification, job 2 still Mallory's, one key certifies.
    let list = srv
        .get_json("/v1/kernels/replayed_k/1.0.0/verifications")
        .await;
    assert_eq!(
        list["verifications"].as_array().map(Vec::len),
        Some(1),
        "{list}"
    );
    let j2 = srv.get_json(&format!("/v1/jobs/{job2}")).await;
    assert_eq!(
        (j2["state"].as_str(), j2["verification_id"].as_i64()),
        (Some("running"), None)
    );
    let (st, r) = resolve(2).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{r}");
    assert!(
        r["excluded"]
            .to_string()
            .contains("1 worker key(s) certify"),
        "{r}"
    );
    // The refusals are in the audit log, the replay with the job it was issued for.
    let store = kernel_store::Store::connect(&srv.db_url).await.unwrap();
    let refused: Vec<Value> = store
        .audit_entries(10_000)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.action == "verification.certificate_refused")
        .map(|e| e.detail)
        .collect();
    store.close().await;
    assert_eq!(refused.len(), 3, "{refused:?}");
    assert!(refused.iter().all(|d| d["job_id"] == job2), "{refused:?}");
    assert!(
        refused
            .iter()
            .any(|d| d["certificate_job_id"] == job1 && d["certificate_nonce"] == nonce1.as_str()),
        "{refused:?}"
    );

    // 6. Mallory's own verification of job 2, bound to her claim, counts as a second key.
    let (report2, cert2) = signed_report(&c2, Some(&km));
    let (st, r) = post(&mallory, &c2, &report2, &cert2).await;
    assert_eq!(st, StatusCode::CREATED, "{r}");
    assert_eq!(resolve(2).await.0, StatusCode::OK);
    assert_eq!(resolve(3).await.0, StatusCode::NOT_FOUND);
}
