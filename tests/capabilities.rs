//! The capability audit (docs/spec.md section 3b) through the real hub, on SQLite and
//! PostgreSQL: a worker's report carries the audit of the compiled code; the hub holds it to
//! the manifest's `[[capability]]` declarations, shows it in the kernel's JSON and on its
//! dashboard page, and the policy list and the resolver refuse a kernel whose code reads a
//! clock unless the manifest declares it and the policy asks for it (`allow:clock`), while a
//! declared `trap` is handed out by default.

mod support;

use reqwest::StatusCode;
use serde_json::{json, Value};
use support::{bundle_files, Backend, TestServer};

both_backends!(the_audit_is_shown_and_gates_the_policy);

/// A recorded bit-exact report (silu_and_mul on an H200), re-targeted at the job.
const EXACT: &str = "recorded/silu_and_mul";

/// Submit a silu kernel declaring `declared` (name, reason), with archs open.
async fn submit(srv: &TestServer, token: &str, name: &str, declared: &[(&str, &str)]) -> Value {
    let (m, s) = bundle_files(name, "1.0.0", "");
    let mut m = m.replace("archs = [\"sm_90\"]", "archs = []");
    for (c, why) in declared {
        m.push_str(&format!(
            "\n[[capability]]\nname = \"{c}\"\nreason = \"{why}\"\n"
        ));
    }
    let (st, v) = srv
        .post("/v1/kernels", token, &json!({"manifest": m, "source": s}))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    v
}

/// The audit a worker reports for the claimed kernel: `found` (name, evidence) in its bf16
/// module, its manifest's declarations.
fn audit(claim: &Value, found: &[(&str, &str)]) -> Value {
    let m = kernel_registry::Manifest::parse(claim["kernel"]["manifest_toml"].as_str().unwrap())
        .unwrap();
    let mut found: Vec<Value> = found
        .iter()
        .map(|(c, e)| json!({"name": c, "evidence": [e], "dtypes": ["bf16"]}))
        .collect();
    found.sort_by_key(|f| f["name"].as_str().unwrap().to_string());
    json!({"audited": true, "found": found, "declared": m.capabilities})
}

/// Claim the next job and report it with the audit `found`.
async fn verify_with_audit(srv: &TestServer, worker: &str, found: &[(&str, &str)]) {
    support::claim_and_report(srv, worker, |claim| {
        let mut r = support::recorded_report(EXACT, claim, "sm_90");
        r["capabilities"] = audit(claim, found);
        r
    })
    .await;
}

async fn approved(srv: &TestServer, policy: &str) -> Vec<String> {
    let v = srv
        .get_json(&format!(
            "/v1/kernels?op=silu&dtype=bf16&arch=sm_90&policy={policy}"
        ))
        .await;
    let mut names: Vec<String> = v["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

async fn the_audit_is_shown_and_gates_the_policy(b: Backend) {
    let srv = TestServer::start(&b, &["--no-bundled"]).await;
    let token = srv.token("submit");
    let worker = srv.token("worker");
    // Clean; a declared trap; a declared clock; an undeclared clock; no audit (an older
    // worker's report).
    submit(&srv, &token, "cap_clean", &[]).await;
    verify_with_audit(&srv, &worker, &[]).await;
    submit(
        &srv,
        &token,
        "cap_trap",
        &[("trap", "traps on a launch shape the rules never produce")],
    )
    .await;
    verify_with_audit(&srv, &worker, &[("trap", "trap")]).await;
    submit(
        &srv,
        &token,
        "cap_clock",
        &[("clock", "times its phases <for> & a profiler")],
    )
    .await;
    verify_with_audit(&srv, &worker, &[("clock", "%globaltimer")]).await;
    submit(&srv, &token, "cap_sneaky", &[]).await;
    verify_with_audit(&srv, &worker, &[("clock", "%globaltimer")]).await;
    // A report with no audit at all: one from a worker of before the audit.
    submit(&srv, &token, "cap_unaudited", &[]).await;
    support::claim_and_report(&srv, &worker, |claim| {
        let mut r = support::recorded_report(EXACT, claim, "sm_90");
        r.as_object_mut().unwrap().remove("capabilities");
        r
    })
    .await;

    // The kernel's JSON: the declarations in its manifest, the audit and what a default
    // policy says of it per verification.
    let k = srv.get_json("/v1/kernels/cap_clock/1.0.0").await;
    assert_eq!(k["manifest"]["capabilities"][0]["name"], "clock", "{k}");
    let v = &k["verifications"][0];
    assert_eq!(v["capabilities"]["audited"], true, "{v}");
    assert_eq!(v["capabilities"]["found"][0]["name"], "clock");
    assert_eq!(v["capabilities"]["found"][0]["evidence"][0], "%globaltimer");
    assert!(
        v["capabilities_refused"][0]
            .as_str()
            .unwrap()
            .contains("add `allow:clock`"),
        "{v}"
    );
    let k = srv.get_json("/v1/kernels/cap_sneaky/1.0.0").await;
    assert_eq!(
        k["verifications"][0]["capabilities_refused"][0],
        "reads a clock (%globaltimer) but the manifest does not declare capability `clock`"
    );
    let k = srv.get_json("/v1/kernels/cap_trap/1.0.0").await;
    assert_eq!(k["verifications"][0]["capabilities_refused"], json!([]));
    // No audit in the report (certified as it was made), and every policy refuses it: what
    // its compiled code can do is unknown.
    let k = srv.get_json("/v1/kernels/cap_unaudited/1.0.0").await;
    assert_eq!(k["verifications"][0]["capabilities"], Value::Null, "{k}");
    let why = k["verifications"][0]["capabilities_refused"][0]
        .as_str()
        .unwrap();
    assert!(why.contains("before the capability audit"), "{k}");
    // ... and its verdict is stale, so that `verify-request --stale` queues a verification
    // that audits it; an audited kernel's stale reasons do not say so.
    let stale = srv.get_json("/v1/kernels?arch=sm_90&stale=true").await;
    let reasons = |name: &str| -> Vec<String> {
        stale["kernels"]
            .as_array()
            .unwrap()
            .iter()
            .find(|k| k["name"] == name)
            .map(|k| serde_json::from_value(k["stale"].clone()).unwrap())
            .unwrap_or_default()
    };
    assert!(
        reasons("cap_unaudited")
            .iter()
            .any(|r| r.contains("was not audited")),
        "{stale}"
    );
    assert!(
        !reasons("cap_clean")
            .iter()
            .any(|r| r.contains("was not audited")),
        "{stale}"
    );
    // The full record carries it in the report (certified with it).
    let vs = srv
        .get_json("/v1/kernels/cap_trap/1.0.0/verifications")
        .await;
    assert_eq!(
        vs["verifications"][0]["report"]["capabilities"]["declared"][0]["name"],
        "trap"
    );

    // The policy list: a clock only where declared and allowed; an undeclared one never.
    assert_eq!(approved(&srv, "bit_exact").await, ["cap_clean", "cap_trap"]);
    assert_eq!(
        approved(&srv, "bit_exact,allow:clock").await,
        ["cap_clean", "cap_clock", "cap_trap"]
    );
    assert_eq!(
        approved(&srv, "bit_exact,audited,allow:clock").await,
        ["cap_clean", "cap_clock", "cap_trap"]
    );
    // The resolver: the same gate, and each refusal says why.
    let q =
        "/v1/resolve?op=silu&dtype=bf16&arch=sm_90&cols=4096&rows=4096&policy=bit_exact,audited";
    let (st, r) = srv.get(q).await;
    assert_eq!(st, StatusCode::OK, "{r}");
    assert!(
        ["cap_clean", "cap_trap"].contains(&r["kernel"]["name"].as_str().unwrap()),
        "{r}"
    );
    // Where none qualifies, each refused kernel's line says why.
    let excluded = |r: &Value| -> String {
        r["excluded"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|x| x.as_str().unwrap_or(""))
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .unwrap_or_default()
    };
    let (st, r) = srv
        .get("/v1/resolve?op=silu&dtype=bf16&arch=sm_90&cols=4096&rows=4096&policy=bit_exact,confirmed:5")
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{r}");
    let text = excluded(&r);
    assert!(
        text.contains("does not declare capability `clock`") && text.contains("allow:clock"),
        "{r}"
    );

    // A report whose declarations are not the manifest's is refused naming the field.
    submit(&srv, &token, "cap_liar", &[("trap", "bad shapes")]).await;
    let (st, claim) = srv
        .post(
            "/v1/jobs/claim",
            &worker,
            &json!({"worker": "test-worker", "arch": "sm_90"}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{claim}");
    let mut r = support::recorded_report(EXACT, &claim, "sm_90");
    r["capabilities"] = json!({"audited": true, "found": [], "declared": []});
    let job = claim["job"]["id"].as_i64().unwrap();
    let (st, e) = srv
        .post(
            &format!("/v1/jobs/{job}/report"),
            &worker,
            &json!({"lease_id": claim["lease_id"], "report": r}),
        )
        .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    assert!(e.to_string().contains("capabilities.declared"), "{e}");

    // The dashboard's kernel page: declarations, the audit table, the refusals, escaped.
    let page = |path: &'static str| {
        let srv = &srv;
        async move {
            let r = srv.client.get(srv.url(path)).send().await.unwrap();
            assert_eq!(r.status(), StatusCode::OK, "{path}");
            r.text().await.unwrap()
        }
    };
    let html = page("/kernels/cap_clock/1.0.0").await;
    assert!(html.contains("id=\"declared-capabilities\""), "{html}");
    assert!(
        html.contains("times its phases &lt;for&gt; &amp; a profiler"),
        "{html}"
    );
    assert!(html.contains("What the compiled code can do"));
    assert!(html.contains("%globaltimer"));
    assert!(html.contains("add `allow:clock`"), "{html}");
    let html = page("/kernels/cap_sneaky/1.0.0").await;
    assert!(html.contains("not declared"), "{html}");
    assert!(
        html.contains("A default policy refuses it: reads a clock (%globaltimer) but the manifest does not declare capability `clock`"),
        "{html}"
    );
    let html = page("/kernels/cap_clean/1.0.0").await;
    assert!(html.contains("class=\"audit-clean\""), "{html}");
    assert!(!html.contains("A default policy refuses it"));
    let html = page("/kernels/cap_unaudited/1.0.0").await;
    assert!(html.contains("class=\"error audit-incomplete\""), "{html}");
    assert!(html.contains("made before the capability audit"), "{html}");
    assert!(
        html.contains("A default policy refuses it: the compiled code could not be audited"),
        "{html}"
    );
}
