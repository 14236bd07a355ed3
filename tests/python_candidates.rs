//! Python candidates (docs/spec.md section 2b, issue 16) over HTTP, on SQLite and on PostgreSQL: only a token
//! of scope `submit-python` submits one, and reports and resolve work across runtimes.

mod support;

use reqwest::StatusCode;
use serde_json::{json, Value};
use support::{bundle_files, detail, Backend, TestServer};

both_backends!(
    a_python_candidate_needs_the_submit_python_scope,
    reports_and_resolve_across_runtimes,
    a_backward_candidates_setup_is_stored_and_shown,
);

/// A Python silu candidate (manifest, source).
fn python_silu(name: &str) -> (String, String) {
    (
        format!(
            r#"name = "{name}"
version = "1.0.0"
op = "silu"
description = "F.silu from PyTorch"
authors = ["tests"]
license = "MIT"
runtime = "python"
source = "kernel.py"
requires = ["torch>=2.4"]

[entry]
bf16 = "silu"
"#
        ),
        "import torch.nn.functional as F\n\n\ndef silu(x):\n    return F.silu(x)\n".to_string(),
    )
}

async fn a_python_candidate_needs_the_submit_python_scope(b: Backend) {
    let srv = TestServer::start(&b, &["--no-bundled"]).await;
    let submit = srv.token("submit");
    let python = srv.token("submit-python");
    let (m, s) = python_silu("py_silu");
    let body = json!({"manifest": m, "source": s});

    // Without a token: 401; a `submit` token: 403 naming the scope and why.
    let (st, p, _) = srv.post_raw("/v1/kernels", None, &body).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED, "{p}");
    let (st, p) = srv.post("/v1/kernels", &submit, &body).await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{p}");
    assert!(
        detail(&p).contains("submit-python") && detail(&p).contains("arbitrary code"),
        "{p}"
    );
    assert_eq!(p["field"], "runtime", "{p}");
    let (st, p) = srv.get("/v1/kernels/py_silu/1.0.0").await;
    assert_eq!(st, StatusCode::NOT_FOUND, "refused means not stored: {p}");

    // `submit-python` submits it; the kernel says its runtime.
    let (st, sub) = srv.post("/v1/kernels", &python, &body).await;
    assert_eq!(st, StatusCode::CREATED, "{sub}");
    assert_eq!(sub["kernel"]["runtime"], "python", "{sub}");
    let k = srv.get_json("/v1/kernels/py_silu/1.0.0").await;
    assert_eq!(k["runtime"], "python", "{k}");
    let src = srv
        .get_json(&format!("/v1/sources/{}", sub["digest"].as_str().unwrap()))
        .await;
    assert!(src.to_string().contains("def silu(x)"), "{src}");

    // ... but not a CUDA kernel, which needs `submit`; CUDA kernels list no runtime.
    let (cm, cs) = bundle_files("cuda_silu", "1.0.0", "");
    let cuda = json!({"manifest": cm, "source": cs});
    let (st, p) = srv.post("/v1/kernels", &python, &cuda).await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{p}");
    assert!(detail(&p).contains("needs `submit`"), "{p}");
    let (st, sub) = srv.post("/v1/kernels", &submit, &cuda).await;
    assert_eq!(st, StatusCode::CREATED, "{sub}");
    assert!(sub["kernel"].get("runtime").is_none(), "{sub}");

    // A bad Python manifest is a problem naming the field.
    let bad = json!({"manifest": m.replace("\"torch>=2.4\"", "\"torch\""), "source": s});
    let (st, p) = srv.post("/v1/kernels", &python, &bad).await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{p}");
    assert_eq!(p["field"], "requires[0]", "{p}");
    assert!(detail(&p).contains("gives no version"), "{p}");
    let nodef = json!({"manifest": m, "source": "def other(x):\n    return x  # silu\n"});
    let (st, p) = srv.post("/v1/kernels", &python, &nodef).await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{p}");
    assert_eq!(p["field"], "entry.bf16", "{p}");

    // Tokens of the new scope are made and listed like any other.
    let (st, p) = srv
        .post(
            "/v1/tokens",
            &submit,
            &json!({"name": "x", "scopes": ["submit-python"]}),
        )
        .await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{p}");
    let admin = srv.token("admin");
    let (st, p) = srv
        .post(
            "/v1/tokens",
            &admin,
            &json!({"name": "ci-python", "scopes": ["submit-python"]}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{p}");
    let (st, p) = srv
        .post(
            "/v1/tokens",
            &admin,
            &json!({"name": "bad", "scopes": ["python"]}),
        )
        .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{p}");
    assert!(detail(&p).contains("submit-python"), "{p}");
}

async fn reports_and_resolve_across_runtimes(b: Backend) {
    let srv = TestServer::start(&b, &["--no-bundled"]).await;
    let submit = srv.token("submit");
    let python = srv.token("submit-python");
    let worker = srv.token("worker");
    let (m, s) = python_silu("py_silu");
    let (st, py) = srv
        .post("/v1/kernels", &python, &json!({"manifest": m, "source": s}))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{py}");
    let (cm, cs) = bundle_files("cuda_silu", "1.0.0", "");
    let (st, cu) = srv
        .post(
            "/v1/kernels",
            &submit,
            &json!({"manifest": cm, "source": cs}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{cu}");

    // A worker verifies both (the CI has no GPU: recorded reports, re-targeted at each job):
    // the Python candidate bit-exact at 3223 GB/s, the CUDA kernel 1 ulp off at 3327 GB/s. The
    // Python one's report says which interpreter and packages it ran with.
    // The hub holds each report to the kernel's runtime: a Python candidate's names its Python
    // environment and compiles nothing; a CUDA kernel's has no Python environment.
    for _ in 0..2 {
        let (st, claim) = srv
            .post(
                "/v1/jobs/claim",
                &worker,
                &json!({"worker": "w", "arch": "sm_90"}),
            )
            .await;
        assert_eq!(st, StatusCode::OK, "{claim}");
        let job = claim["job"]["id"].as_i64().unwrap();
        let is_py = claim["kernel"]["digest"] == py["digest"];
        let fixture = if is_py {
            "recorded/silu_and_mul"
        } else {
            "recorded/silu_and_mul_fused"
        };
        let mut r = support::recorded_report(fixture, &claim, "sm_90");
        let python = json!({"python": "3.12.3", "torch": "2.11.0+cu130",
                            "packages": {"torch": "2.11.0+cu130"}, "isolation": []});
        let post = |r: &Value| json!({"lease_id": claim["lease_id"], "report": r});
        let url = format!("/v1/jobs/{job}/report");
        if !is_py {
            r["python"] = python.clone();
        }
        let (st, p) = srv.post(&url, &worker, &post(&r)).await;
        assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{p}");
        assert!(p.to_string().contains("runtime is"), "{p}");
        if is_py {
            r["python"] = python;
            // What a Python candidate's run records: no NVRTC modules.
            r.as_object_mut().unwrap().remove("compiled");
        } else {
            r.as_object_mut().unwrap().remove("python");
        }
        // The model level (test data): the Python candidate keeps the argmax at 504 of 512
        // positions and moves the logits by 0.074; the CUDA kernel changes nothing.
        let (argmax, diff) = if is_py {
            (504.0 / 512.0, 0.074)
        } else {
            (1.0, 0.0)
        };
        r["model"] = json!([{"model_name": "tiny-llama", "model_digest": format!("sha256:{}", "a".repeat(64)),
            "dtype": "bf16", "tokens": 512, "layers_replaced": 4, "max_logit_abs_diff": diff,
            "argmax_match_fraction": argmax, "top5_overlap": 1.0, "mean_kl": 1e-4}]);
        let (st, p) = srv.post(&url, &worker, &post(&r)).await;
        assert_eq!(st, StatusCode::CREATED, "{p}");
    }
    let q = "/v1/resolve?op=silu&dtype=bf16&arch=sm_90&cols=4096&rows=4096";

    // By default only CUDA kernels are considered: bit_exact finds none, and says why the
    // Python candidate is out.
    let (st, p) = srv.get(&format!("{q}&policy=bit_exact")).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{p}");
    assert!(p.to_string().contains("ask with runtime=any"), "{p}");
    // With runtime=any the Python candidate is the bit-exact one ...
    let (st, r) = srv.get(&format!("{q}&policy=bit_exact&runtime=any")).await;
    assert_eq!(st, StatusCode::OK, "{r}");
    assert_eq!(
        (r["kernel"]["name"].as_str(), r["runtime"].as_str()),
        (Some("py_silu"), Some("python"))
    );
    let v = srv.get_json(r["verification_url"].as_str().unwrap()).await;
    assert_eq!(v["report"]["python"]["torch"], "2.11.0+cu130", "{v}");
    // ... and at ulp:1 the faster CUDA kernel wins across runtimes, the Python one qualifying too.
    let (st, r) = srv.get(&format!("{q}&policy=ulp:1&runtime=any")).await;
    assert_eq!(st, StatusCode::OK, "{r}");
    assert_eq!(
        (r["kernel"]["name"].as_str(), r["runtime"].as_str()),
        (Some("cuda_silu"), Some("cuda"))
    );
    assert!(r["also_qualifying"].to_string().contains("py_silu"), "{r}");
    let (st, p) = srv.get(&format!("{q}&runtime=triton")).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{p}");
    assert!(detail(&p).contains("`runtime`"), "{p}");

    // The dashboard compares the field: both kernels in one table, the Python one marked.
    let html = |path: &str| {
        let url = srv.url(path);
        async move { reqwest::get(url).await.unwrap().text().await.unwrap() }
    };
    let overview = html("/?op=silu").await;
    assert!(
        overview.contains("py_silu") && overview.contains("cuda_silu"),
        "{overview}"
    );
    assert!(
        overview.contains("a Python candidate (docs/spec.md section 2b)"),
        "{overview}"
    );
    let page = html("/kernels/py_silu/1.0.0").await;
    assert!(page.contains("id=\"runtime\""), "{page}");
    assert!(!html("/kernels/cuda_silu/1.0.0")
        .await
        .contains("id=\"runtime\""));

    // The field: per op, dtype and arch, both runtimes side by side with exactness, model-level
    // agreement and speed against the roofline; the bit-exact one first.
    let field = html("/field?op=silu").await;
    let table = &field[field.find("id=\"field\"").expect("a field table")..];
    let (py_at, cu_at) = (
        table.find("py_silu 1.0.0").unwrap(),
        table.find("cuda_silu 1.0.0").unwrap(),
    );
    assert!(py_at < cu_at, "the bit-exact candidate first: {field}");
    for needle in [
        "silu · default · bf16 · sm_90",
        "href=\"/policy?op=silu&amp;dtype=bf16&amp;arch=sm_90&amp;runtime=any\"",
        "data-runtime=\"Python\"",
        "data-runtime=\"CUDA\"",
        "98.4%",   // the Python candidate's argmax match
        "7.40e-2", // its max logit diff
        "100.0%",  // the CUDA kernel's argmax match
        "tiny-llama",
        "bit-exact",
        "max 1 ulp",
        "of this device's measured copy bandwidth",
    ] {
        assert!(
            field.contains(needle),
            "the field lacks `{needle}`: {field}"
        );
    }
    assert!(overview.contains("href=\"/field?op=silu\""), "{overview}");
    let one = html("/field?op=silu&limit=1").await;
    assert!(
        one.contains("1–1 of 2") && one.contains("offset=1"),
        "{one}"
    );
    assert!(!one.contains("cuda_silu 1.0.0"), "{one}");
    assert!(html("/field?op=silu&limit=1&offset=1")
        .await
        .contains("cuda_silu 1.0.0"));
    assert!(html("/field?op=silu&dtype=f32")
        .await
        .contains("No verification matches these filters"));
    let r = reqwest::get(srv.url("/field?limit=0")).await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    // The policy explorer resolves across runtimes by default (the Python candidate is the
    // bit-exact one) and says what a client without the opt-in gets with runtime=cuda.
    let chosen = |p: &str| -> String {
        let at = p.find("class=\"chosen\"").expect("a chosen cell");
        p[at..].chars().take(400).collect()
    };
    let explorer = "/policy?op=silu&dtype=bf16&arch=sm_90&cols=4096&rows=4096";
    let p = html(&format!("{explorer}&policy=bit_exact")).await;
    let c = chosen(&p);
    assert!(c.contains("py_silu 1.0.0") && c.contains(">python<"), "{c}");
    assert!(
        p.contains("&amp;runtime=any\""),
        "the JSON link asks the same: {p}"
    );
    let p = html(&format!("{explorer}&policy=bit_exact&runtime=cuda")).await;
    assert!(chosen(&p).contains("none"), "{p}");
    assert!(p.contains("ask with runtime=any"), "{p}");
    let p = html(&format!("{explorer}&policy=ulp:1")).await;
    assert!(
        chosen(&p).contains("cuda_silu 1.0.0"),
        "the faster CUDA kernel wins at ulp:1: {p}"
    );

    // Listing by policy covers both runtimes.
    let l = srv
        .get_json("/v1/kernels?op=silu&policy=ulp:1&dtype=bf16&arch=sm_90")
        .await;
    assert_eq!(l["total"], 2, "{l}");
}

/// A Python candidate of a backward op with a setup function (`[setup]`, docs/python-candidates.md)
/// is stored with it: its source comes back with the setup in the manifest and the same digest
/// (re-checked), and the kernel page says what runs before each call.
async fn a_backward_candidates_setup_is_stored_and_shown(b: Backend) {
    let srv = TestServer::start(&b, &["--no-bundled"]).await;
    let python = srv.token("submit-python");
    let m = r#"name = "py_rms_bwd"
version = "1.1.0"
op = "rms_norm_backward"
semantics = "llama"
description = "eager autograd of LlamaRMSNorm, its forward in a setup"
authors = ["tests"]
license = "MIT"
runtime = "python"
source = "kernel.py"
requires = ["torch>=2.4"]

[entry]
bf16 = "rms_norm_backward"

[setup]
bf16 = "forward"
"#;
    let s = "import torch\n\n\ndef forward(x, w, eps):\n    return None\n\n\ndef rms_norm_backward(dy, x, w, eps, state):\n    return dy.clone(), w.clone()\n";
    let (st, sub) = srv
        .post("/v1/kernels", &python, &json!({"manifest": m, "source": s}))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{sub}");
    let digest = sub["digest"].as_str().unwrap().to_string();
    let src = srv.get_json(&format!("/v1/sources/{digest}")).await;
    assert_eq!(src["digest"], digest.as_str(), "{src}");
    assert_eq!(
        src["manifest"]["setup"],
        json!({"bf16": "forward"}),
        "{src}"
    );
    assert!(
        src["manifest_toml"]
            .as_str()
            .is_some_and(|t| t.contains("[setup]")),
        "{src}"
    );
    // A setup that names no function of the source is refused, naming the field.
    let bad = s.replace("def forward(", "def forward_(");
    let (st, p) = srv
        .post(
            "/v1/kernels",
            &python,
            &json!({"manifest": m.replace("1.1.0", "1.1.1"), "source": bad}),
        )
        .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{p}");
    assert_eq!(p["field"], "setup.bf16", "{p}");
    let (st, html) = srv.get_page("/kernels/py_rms_bwd/1.1.0").await;
    assert_eq!(st, StatusCode::OK);
    assert!(
        html.contains("id=\"setup\"") && html.contains("<code>forward</code> (bf16)"),
        "{html}"
    );
}
