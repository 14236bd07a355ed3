//! The dashboard: HTML snapshots of every page on the hand-written fixture reports of
//! tests/fixtures/reports (not measurements; ids and times redacted),
//! the empty and the private cases, and each page loaded in a real headless Chromium.

mod support;

use reqwest::StatusCode;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use support::{bundle_files, Backend, TestServer};

/// The hand-written fixture reports have one case; the kernel page's plots need a sweep over
/// cols, so each case is repeated at other widths with the same exactness and a made-up speed
/// that rises with cols (test data only; `support::retarget` gives each the time and bytes
/// that make its GB/s, so that the hub accepts it).
fn swept_report(fixture: &str, claim: &Value, arch: &str) -> Value {
    let mut r = support::recorded_report(fixture, claim, arch);
    let template = r["cases"][0].clone();
    let base_gbps = template["speed"]["gbps"].as_f64().unwrap();
    let copy_gbps = r["device"]["copy_gbps"].as_f64().unwrap();
    let mut cases = Vec::new();
    for (i, cols) in [64u64, 127, 1000, 4096, 8192, 65536]
        .into_iter()
        .enumerate()
    {
        let mut c = template.clone();
        let rows = 4096u64;
        let scale = (rows * cols) as f64 / template["exactness"]["elements"].as_f64().unwrap();
        c["id"] = json!(format!("bf16/{rows}x{cols}/normal"));
        c["cols"] = json!(cols);
        let e = &mut c["exactness"];
        e["elements"] = json!(rows * cols);
        e["mismatches"] = json!((e["mismatches"].as_f64().unwrap() * scale).round() as u64);
        let hist: Vec<u64> = e["ulp_histogram"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| (n.as_f64().unwrap() * scale).round() as u64)
            .collect();
        e["ulp_histogram"] = json!(hist);
        let a = &mut c["accuracy"];
        a["candidate_max_abs"] =
            json!(a["candidate_max_abs"].as_f64().unwrap() * (1.0 + 0.2 * i as f64));
        a["reference_max_abs"] =
            json!(a["reference_max_abs"].as_f64().unwrap() * (1.0 + 0.25 * i as f64));
        let gbps = if cols == 8192 {
            base_gbps
        } else {
            base_gbps * cols as f64 / (cols as f64 + 512.0) * 1.06
        };
        c["speed"]["gbps"] = json!(gbps);
        c["speed"]["copy_fraction"] = json!(gbps / copy_gbps);
        cases.push(c);
    }
    r["cases"] = json!(cases);
    support::retarget(&mut r, claim, arch);
    r
}

async fn submit(srv: &TestServer, token: &str, name: &str, description: &str, body: &str) {
    let (m, s) = bundle_files(name, "1.0.0", body);
    let m = m
        .replace(
            "description = \"test kernel\"",
            &format!("description = {description:?}"),
        )
        .replace("archs = [\"sm_90\"]", "archs = []");
    let (st, v) = srv
        .post("/v1/kernels", token, &json!({"manifest": m, "source": s}))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
}

async fn verify_next(srv: &TestServer, worker: &str, fixture: &str, arch: &str) {
    support::claim_and_report(srv, worker, |claim| swept_report(fixture, claim, arch)).await;
}

const HOSTILE: &str = "<script>alert('owned')</script> & \"quoted\" <b>bold</b>";

/// A Python candidate (docs/spec.md section 2b) of silu, submitted with a `submit-python` token and verified on
/// sm_90 from the `one_ulp_fast` fixture at half its speed (1 ulp off, 1500 GB/s), with a
/// model-level measurement (argmax kept at 504 of 512 positions, logits moved by 0.074): test
/// data shaped like a Python candidate's report (its Python environment, no NVRTC modules).
async fn submit_python_candidate(srv: &TestServer, worker: &str) {
    let manifest = r#"name = "silu_compiled"
version = "1.0.0"
op = "silu"
description = "torch.compile of F.silu (a Python candidate)"
authors = ["tests"]
license = "MIT"
runtime = "python"
source = "kernel.py"
requires = ["torch>=2.5"]

[entry]
bf16 = "silu"
"#;
    let source = "import torch\nimport torch.nn.functional as F\n\n\ndef silu(x):\n    return torch.compile(F.silu)(x)\n";
    let (st, v) = srv
        .post(
            "/v1/kernels",
            &srv.token("submit-python"),
            &json!({"manifest": manifest, "source": source}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    support::claim_and_report(srv, worker, |claim| {
        let mut r = swept_report("one_ulp_fast", claim, "sm_90");
        for c in r["cases"].as_array_mut().unwrap() {
            if let Some(sp) = c.get_mut("speed").filter(|s| s.is_object()) {
                for k in ["gbps", "speedup"] {
                    sp[k] = json!(sp[k].as_f64().unwrap() * 0.5);
                }
            }
        }
        support::retarget(&mut r, claim, "sm_90");
        r.as_object_mut().unwrap().remove("compiled");
        r["python"] = json!({"python": "3.12.3", "torch": "2.9.0",
            "packages": {"torch": "2.9.0"}, "isolation": []});
        r["model"] = json!([{"model_name": "tiny-llama",
            "model_digest": format!("sha256:{}", "b".repeat(64)), "dtype": "bf16",
            "tokens": 512, "layers_replaced": 4, "max_logit_abs_diff": 0.074,
            "argmax_match_fraction": 504.0 / 512.0, "top5_overlap": 1.0, "mean_kl": 1e-4}]);
        r
    })
    .await;
}

/// Four silu kernels: exact (sm_90), 1 ulp off but faster (sm_90, with a hostile
/// description), exact and fastest but verified only on sm_80, and one never verified; and a
/// Python candidate, 1 ulp off and slower, measured at the model level too.
async fn populated(extra: &[&str]) -> (Backend, TestServer) {
    let b = Backend::sqlite();
    let srv = TestServer::start(&b, &[&["--no-bundled"], extra].concat()).await;
    let submit_t = srv.token("submit");
    let worker = srv.token("worker");
    // First: jobs are claimed oldest first, and silu_pending's stays queued.
    submit_python_candidate(&srv, &worker).await;
    for (name, desc, fixture, arch) in [
        ("silu_exact", "eager-exact SiLU", Some("exact"), "sm_90"),
        ("silu_off", HOSTILE, Some("one_ulp_fast"), "sm_90"),
        (
            "silu_old",
            "exact, verified on A100 only",
            Some("exact_fast"),
            "sm_80",
        ),
        ("silu_pending", "not verified yet", None, ""),
    ] {
        // The source carries markup too: it must be shown as text.
        submit(
            &srv,
            &submit_t,
            name,
            desc,
            "/* </pre><script>x()</script> */",
        )
        .await;
        if let Some(f) = fixture {
            verify_next(&srv, &worker, f, arch).await;
        }
    }
    (b, srv)
}

async fn page(srv: &TestServer, path: &str) -> (StatusCode, String) {
    srv.get_page(path).await
}

async fn html_ok(srv: &TestServer, path: &str) -> String {
    let (st, body) = page(srv, path).await;
    assert_eq!(st, StatusCode::OK, "GET {path}: {body}");
    body
}

/// One element per line, the stylesheet elided, ids and times redacted.
fn snapshot(name: &str, html: &str) {
    let css_start = html.find("<style>").unwrap();
    let css_end = html.find("</style>").unwrap();
    let html = format!("{}<style>[css]{}", &html[..css_start], &html[css_end..]);
    let pretty = html.replace("><", ">\n<");
    insta::with_settings!({filters => vec![
        (r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)", "[time]"),
        (r"\d{4}-\d\d-\d\d \d\d:\d\d", "[time]"),
        // The "verified" cell's day and hour (`dashboard::verified`).
        (r"\d{4}-\d\d-\d\d</span> \d\d:\d\d", "[day]</span> [hour]"),
        (r"/v1/verifications/\d+", "/v1/verifications/[id]"),
        (r#"id="v\d+""#, r#"id="v[id]""#),
        (r"#\d+ (queued|running|done|failed)", "#[id] $1"),
    ]}, {
        insta::assert_snapshot!(name, pretty);
    });
}

fn assert_escaped(html: &str) {
    assert!(
        !html.contains("<script>"),
        "untrusted text reached the page as markup"
    );
    assert!(
        !html.contains("<b>bold"),
        "untrusted markup was not escaped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overview_kernel_and_policy_pages() {
    let (_b, srv) = populated(&[]).await;

    let home = html_ok(&srv, "/").await;
    assert_escaped(&home);
    assert!(
        home.contains("&lt;script&gt;alert"),
        "the hostile text is shown as text"
    );
    for needle in [
        "silu_exact 1.0.0",
        "silu_off 1.0.0",
        "bit-exact",
        "max 1 ulp",
        "25.0%",
        "3000",  // GB/s of silu_off at 4096x8192
        "72%",   // of the 4190 GB/s copy roofline
        "2.00x", // speedup over the reference
        "NVIDIA H200",
        "sm_80",
        "Awaiting verification",
        "silu_pending",
    ] {
        assert!(home.contains(needle), "overview lacks `{needle}`");
    }
    snapshot("overview", &home);

    // Filters: the arch filter leaves sm_80's kernel as "not verified on sm_90".
    let sm90 = html_ok(&srv, "/?arch=sm_90&dtype=bf16&op=silu").await;
    assert!(sm90.contains("silu_exact") && sm90.contains("silu_off"));
    assert!(
        sm90.contains("not verified on sm_90 (only on sm_80)"),
        "{sm90}"
    );
    let none = html_ok(&srv, "/?op=layer_norm").await;
    assert!(none.contains("No verification matches these filters"));
    let (st, bad) = page(&srv, "/?dtype=f8").await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert!(bad.contains("query parameter `dtype`"), "{bad}");

    let k = html_ok(&srv, "/kernels/silu_off/1.0.0").await;
    assert_escaped(&k);
    for needle in [
        "&lt;/pre&gt;&lt;script&gt;x()", // the source, as text
        "580.159.04",                    // driver
        "13.0",                          // CUDA
        "kernelize verify DIR --seed 1",
        "bf16/4096x65536/normal",
        "25.0% of elements differ",
        "copy bandwidth (roofline) 4190 GB/s",
    ] {
        assert!(k.contains(needle), "kernel page lacks `{needle}`");
    }
    assert_eq!(k.matches("<svg").count(), 3, "three plots per verification");
    snapshot("kernel", &k);
    let (st, missing) = page(&srv, "/kernels/nope/1.0.0").await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    assert!(missing.contains("no kernel `nope`"));

    // The explorer gives /v1/resolve's answer.
    let p = html_ok(
        &srv,
        "/policy?policy=bit_exact&dtype=bf16&arch=sm_90&cols=8192&rows=4096",
    )
    .await;
    snapshot("policy", &p);
    // The explorer resolves across runtimes: the API's answer with runtime=any.
    let api = srv
        .get_json(
            "/v1/resolve?op=silu&dtype=bf16&arch=sm_90&cols=8192&rows=4096&policy=bit_exact&runtime=any",
        )
        .await;
    assert_eq!(api["kernel"]["name"], "silu_exact");
    let silu_row = row_of(&p, "silu");
    assert!(silu_row.contains("silu_exact 1.0.0"), "{silu_row}");
    for line in api["excluded"].as_array().unwrap() {
        let line = line.as_str().unwrap();
        assert!(
            silu_row.contains(&escape(line)),
            "the explorer lacks `{line}`"
        );
    }
    let tol = html_ok(
        &srv,
        "/policy?policy=tolerance&dtype=bf16&arch=sm_90&cols=8192&op=silu",
    )
    .await;
    let api = srv
        .get_json("/v1/resolve?op=silu&dtype=bf16&arch=sm_90&cols=8192&policy=tolerance")
        .await;
    assert_eq!(api["kernel"]["name"], "silu_off");
    assert!(row_of(&tol, "silu").contains("silu_off 1.0.0"));
    assert!(!tol.contains("data-op=\"rms_norm\""), "op filter");
    let on_sm80 = html_ok(&srv, "/policy?dtype=bf16&arch=sm_80&cols=8192&op=silu").await;
    assert!(row_of(&on_sm80, "silu").contains("silu_old 1.0.0"));
    // The field: every candidate side by side per op, dtype and arch.
    let field = html_ok(&srv, "/field").await;
    assert_escaped(&field);
    for needle in [
        "The field",
        "silu · default · bf16 · sm_90",
        "silu · default · bf16 · sm_80",
        "silu_exact 1.0.0",
        "silu_off 1.0.0",
        "silu_old 1.0.0",
        "data-runtime=\"CUDA\"",
        "not measured", // the CUDA fixtures have no model level
        "data-runtime=\"Python\"",
        "silu_compiled 1.0.0",
        "98.4%",   // its argmax match
        "7.40e-2", // its max logit diff
        "1500",    // its GB/s
        "72%",
        "resolve across runtimes",
        "vs fastest bit-exact",
        "1.20x", // silu_off's 3000 GB/s over silu_exact's 2500, on sm_90
        "0.60x", // silu_compiled's 1500 over the same
        // torch.compile's rewrites (docs/compile-rewrites.json), plain inductor and exact compile
        "torch.compile's rewrites",
        "transformers LlamaRMSNorm",
        "<strong>bit_exact</strong>",
        "pytorch#179578",
        // the two blocks of the exact phase (session 21's records, the locator's rewrite)
        "rotary embedding",
        "attention through F.scaled_dot_product_attention",
        // the math-library functions proven on every input (sessions 20 and 21), with the
        // rewrites exact compile tried
        "tanh(x) (math library)",
        "exact compile tries x * x * x",
        "gelu(x, approximate=",
    ] {
        assert!(field.contains(needle), "the field lacks `{needle}`");
    }
    assert!(
        !field.contains("silu_pending"),
        "never verified: not in the field"
    );
    snapshot("field", &field);
    let (st, bad) = page(&srv, "/field?dtype=f8").await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert!(bad.contains("query parameter `dtype`"), "{bad}");
    assert!(
        home.contains("href=\"/field\""),
        "the overview links the field"
    );

    let (st, bad) = page(&srv, "/policy?policy=ulp:x&dtype=bf16&arch=sm_90&cols=8192").await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert!(
        bad.contains("`x` after ulp: is not a whole number"),
        "{bad}"
    );
}

/// Kernel rows of the overview's matrix table.
fn matrix_rows(html: &str) -> usize {
    let start = html.find("id=\"matrix\"").expect("a matrix table");
    let end = html[start..].find("</table>").unwrap() + start;
    html[start..end].matches("<a href=\"/kernels/").count()
}

/// The `<tr>` of the explorer's table for `op`.
fn row_of(html: &str, op: &str) -> String {
    let start = html
        .find(&format!("data-op=\"{op}\""))
        .unwrap_or_else(|| panic!("no row for {op}"));
    let end = html[start..].find("</tr>").unwrap() + start;
    html[start..end].to_string()
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_hub_says_how_to_get_verifications() {
    let b = Backend::sqlite();
    // Bundled kernels, all queued, without the project's recorded verdicts.
    let srv = TestServer::start(&b, &["--no-bundled-certificates"]).await;
    let home = html_ok(&srv, "/").await;
    assert!(home.contains("No verifications yet."), "{home}");
    assert!(home.contains("kernelize worker --server"));
    assert!(home.contains("kernelize serve --worker"));
    assert!(home.contains("rms_norm_llama"), "queued kernels are listed");
    let p = html_ok(&srv, "/policy").await;
    assert!(p.contains("never verified"), "defaults resolve at once");
    // the bundled silu at whatever version it is now
    let silu = kernel_registry::KernelBundle::load_dir(&support::kernels_dir().join("silu"))
        .expect("kernels/silu");
    let k = html_ok(&srv, &format!("/kernels/silu/{}", silu.manifest.version)).await;
    assert!(k.contains("has not been verified yet"));
    drop(srv);

    // By default a fresh hub shows the verdicts recorded on the project's GPU run, imported.
    let b = Backend::sqlite();
    let srv = TestServer::start(&b, &[]).await;
    let home = html_ok(&srv, "/").await;
    assert!(!home.contains("No verifications yet."), "{home}");
    let k = html_ok(&srv, &format!("/kernels/silu/{}", silu.manifest.version)).await;
    assert!(k.contains("imported: recorded on the project"), "{k}");
    assert!(k.contains("signed by worker key"), "{k}");
    assert!(k.contains("NVIDIA H200"), "{k}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_reads_cover_the_pages() {
    let (_b, srv) = populated(&["--private-reads"]).await;
    let reader = srv.token("submit");
    for path in ["/", "/kernels/silu_exact/1.0.0", "/policy", "/field"] {
        let (st, _) = page(&srv, path).await;
        assert_eq!(st, StatusCode::UNAUTHORIZED, "{path} without a token");
        let r = srv
            .client
            .get(srv.url(path))
            .bearer_auth(&reader)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{path} with a token");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundreds_of_verdicts_stay_one_table() {
    let b = Backend::sqlite();
    let srv = TestServer::start(&b, &["--no-bundled"]).await;
    let submit_t = srv.token("submit");
    let worker = srv.token("worker");
    let n = 120;
    for i in 0..n {
        submit(
            &srv,
            &submit_t,
            &format!("silu_{i:03}"),
            "bulk",
            &format!("/* {i} */"),
        )
        .await;
        let fixture = ["exact", "one_ulp_fast", "exact_fast"][i % 3];
        verify_next(
            &srv,
            &worker,
            fixture,
            if i % 2 == 0 { "sm_90" } else { "sm_80" },
        )
        .await;
    }
    let t = std::time::Instant::now();
    let home = html_ok(&srv, "/").await;
    assert!(
        t.elapsed().as_secs_f64() < 5.0,
        "overview took {:?}",
        t.elapsed()
    );
    assert_eq!(matrix_rows(&home), n, "one row per kernel x arch x dtype");
    assert!(home.contains(&format!("({n} rows)")));
    let sm80 = html_ok(&srv, "/?arch=sm_80").await;
    assert_eq!(matrix_rows(&sm80), n / 2);
    // The field reads the same rows in one page query: every candidate, paged.
    let t = std::time::Instant::now();
    let field = html_ok(&srv, "/field").await;
    assert!(
        t.elapsed().as_secs_f64() < 5.0,
        "the field took {:?}",
        t.elapsed()
    );
    assert!(field.contains(&format!("({n} rows)")), "{field}");
    let page = html_ok(&srv, "/field?limit=50&offset=100").await;
    assert!(page.contains(&format!("101–120 of {n}")), "{page}");
    assert_eq!(page.matches("<a href=\"/kernels/").count(), 20);
    assert!(sm80.contains("Awaiting verification </h2>") || sm80.contains("not verified on sm_80"));
}

// ---- a real browser -------------------------------------------------------------------------

const CHROMIUM_FLAGS: [&str; 8] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
];

fn on_path(bin: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(bin))
            .find(|f| f.is_file())
    })
}

/// Debian's chromium, installed with apt-get when missing and running as root. `None` (and a
/// loud note) when there is none, unless KERNELIZE_REQUIRE_BROWSER=1, which makes it a failure.
/// Found (or installed) once per test binary: the browser tests run in parallel threads, and two
/// apt-get installs at once fail on dpkg's lock (a fresh machine's first run did).
fn chromium() -> Option<PathBuf> {
    static FOUND: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    match FOUND.get_or_init(find_or_install_chromium) {
        Ok(p) => Some(p.clone()),
        Err(why) => {
            if std::env::var("KERNELIZE_REQUIRE_BROWSER").as_deref() == Ok("1") {
                panic!("a headless browser is required (KERNELIZE_REQUIRE_BROWSER=1) but {why}");
            }
            eprintln!("\n*** SKIPPING the browser test: {why}\n*** set KERNELIZE_REQUIRE_BROWSER=1 to make this a failure\n");
            None
        }
    }
}

fn find_or_install_chromium() -> Result<PathBuf, String> {
    let find = || on_path("chromium").or_else(|| on_path("chromium-browser"));
    if let Some(p) = find() {
        return Ok(p);
    }
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    let mut why =
        "chromium is not on PATH and this is not root, so it was not installed".to_string();
    if root {
        eprintln!("*** chromium missing: apt-get install -y chromium");
        let install = || {
            Command::new("apt-get")
                .args(["install", "-y", "-q", "chromium"])
                .env("DEBIAN_FRONTEND", "noninteractive")
                .status()
                .map(|s| s.success())
                .unwrap_or(false)
        };
        if !install() {
            let _ = Command::new("apt-get").args(["update", "-q"]).status();
            install();
        }
        match find() {
            Some(p) => return Ok(p),
            None => why = "`apt-get install -y chromium` did not install it".into(),
        }
    }
    Err(why)
}

/// Run chromium on `url` with `mode` (`--dump-dom` or `--screenshot=FILE`): (stdout, console
/// lines). Chromium logs every console message as a `CONSOLE` line on stderr.
fn browse(chromium: &Path, profile: &Path, mode: &str, url: &str) -> (String, Vec<String>) {
    browse_at(chromium, profile, (1400, 1000), mode, url)
}

/// `browse` in a window of `size` (width, height) pixels.
fn browse_at(
    chromium: &Path,
    profile: &Path,
    size: (u32, u32),
    mode: &str,
    url: &str,
) -> (String, Vec<String>) {
    let out = Command::new(chromium)
        .args(CHROMIUM_FLAGS)
        .arg(format!("--window-size={},{}", size.0, size.1))
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(["--enable-logging=stderr", "--v=0", mode, url])
        .output()
        .expect("running chromium");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "chromium {mode} {url} failed: {stderr}"
    );
    let console = stderr
        .lines()
        .filter(|l| l.contains(":CONSOLE"))
        .map(str::to_string)
        .collect();
    (String::from_utf8_lossy(&out.stdout).into_owned(), console)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_in_headless_chromium() {
    let Some(chromium) = chromium() else { return };
    let profile = tempfile::tempdir().unwrap();
    let shots = tempfile::tempdir().unwrap();

    // The console check can fail: a page that logs an error is caught.
    let bad = profile.path().join("bad.html");
    std::fs::write(&bad, "<p>x</p><script>console.error('deliberate')</script>").unwrap();
    let (_, console) = browse(
        &chromium,
        profile.path(),
        "--dump-dom",
        &format!("file://{}", bad.display()),
    );
    assert!(
        console.iter().any(|l| l.contains("deliberate")),
        "the console check sees nothing: {console:?}"
    );

    let (_b, srv) = populated(&[]).await;
    let pages = [
        (
            "overview",
            "/".to_string(),
            vec![
                "Verification matrix",
                "silu_off 1.0.0",
                "max 1 ulp",
                "3000",
                "72%",
            ],
            0,
        ),
        (
            "kernel",
            "/kernels/silu_off/1.0.0".to_string(),
            vec![
                "NVIDIA H200",
                "580.159.04",
                "copy bandwidth (roofline) 4190 GB/s",
                "25.0% of elements differ",
            ],
            3,
        ),
        (
            "field",
            "/field".to_string(),
            vec![
                "The field",
                "silu_off 1.0.0",
                "silu_old 1.0.0",
                "silu_compiled 1.0.0",
                "Python",
                "98.4%",
                "max 1 ulp",
                "72%",
            ],
            0,
        ),
        (
            "policy",
            "/policy?policy=bit_exact&dtype=bf16&arch=sm_90&cols=8192&rows=4096".to_string(),
            vec![
                "Policy explorer",
                "silu_exact 1.0.0",
                "fails bit_exact",
                "not verified on sm_90 (only on sm_80)",
            ],
            0,
        ),
    ];
    let update = std::env::var("KERNELIZE_UPDATE_SCREENSHOTS").as_deref() == Ok("1");
    for (name, path, needles, svgs) in pages {
        let url = srv.url(&path);
        let (dom, console) = browse(&chromium, profile.path(), "--dump-dom", &url);
        assert!(console.is_empty(), "{name}: console messages: {console:?}");
        for n in needles {
            assert!(dom.contains(n), "{name}: the rendered page lacks `{n}`");
        }
        assert!(
            !dom.contains("alert('owned')</script>"),
            "{name}: a script from a kernel got in"
        );
        assert_eq!(dom.matches("<svg").count(), svgs, "{name}: plots");
        let png = shots.path().join(format!("{name}.png"));
        let (_, console) = browse(
            &chromium,
            profile.path(),
            &format!("--screenshot={}", png.display()),
            &url,
        );
        assert!(console.is_empty(), "{name}: console messages: {console:?}");
        let bytes = std::fs::read(&png).unwrap_or_else(|e| panic!("{name}: no screenshot: {e}"));
        assert!(
            bytes.starts_with(b"\x89PNG") && bytes.len() > 10_000,
            "{name}: screenshot too small"
        );
        if update {
            let dest = support::repo_root().join(format!("docs/screenshots/{name}.png"));
            std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
            std::fs::write(&dest, &bytes).unwrap();
            eprintln!("wrote {}", dest.display());
        }
    }
}

/// Each page parses its query parameters with the API's functions: a repeated parameter, an
/// unknown one and a value the API refuses are each a 400 HTML page saying what was wrong and
/// what is accepted (not the page with a default), with the API's own message; on both backends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_validate_parameters_like_the_api() {
    let backends: Vec<Backend> = [Some(Backend::sqlite()), Backend::postgres().await]
        .into_iter()
        .flatten()
        .collect();
    for b in backends {
        let srv = TestServer::start(&b, &["--no-bundled-certificates"]).await;
        let silu = kernel_registry::KernelBundle::load_dir(&support::kernels_dir().join("silu"))
            .expect("kernels/silu");
        let kpage = format!("/kernels/silu/{}", silu.manifest.version);
        let bad_page = |path: String, st: StatusCode, body: String, want: &[&str]| {
            assert_eq!(st, StatusCode::BAD_REQUEST, "GET {path}: {body}");
            assert!(
                body.contains("<h1>400 Bad Request</h1>") || body.contains("Policy explorer"),
                "GET {path}: not an HTML page: {body}"
            );
            for w in want {
                assert!(body.contains(w), "GET {path}: lacks `{w}`: {body}");
            }
        };
        // Repeated parameters: refused on every page, as the API refuses them.
        for path in [
            "/?op=silu&op=gelu",
            "/field?dtype=bf16&dtype=f32",
            "/policy?arch=sm_90&arch=sm_80",
            &format!("{kpage}?x=1&x=2"),
        ] {
            let (st, body) = page(&srv, path).await;
            bad_page(
                path.to_string(),
                st,
                body,
                &["is given more than once; give it once"],
            );
        }
        let api = srv
            .client
            .get(srv.url("/v1/kernels?op=silu&op=gelu"))
            .send()
            .await
            .unwrap();
        assert_eq!(api.status(), StatusCode::BAD_REQUEST);
        assert!(api
            .text()
            .await
            .unwrap()
            .contains("query parameter `op` is given more than once; give it once"));
        // Unknown parameters: refused naming the ones the page takes.
        for (path, takes) in [
            (
                "/?opp=silu".to_string(),
                "this route takes: op, dtype, arch, limit, offset, uoffset",
            ),
            (
                "/field?arc=sm_90".to_string(),
                "this route takes: op, dtype, arch, limit, offset",
            ),
            (
                "/policy?polcy=ulp:1".to_string(),
                "this route takes: policy, dtype, arch, cols, rows, op, runtime",
            ),
            (format!("{kpage}?dtype=bf16"), "this route takes none"),
        ] {
            let (st, body) = page(&srv, &path).await;
            bad_page(path.clone(), st, body, &["unknown query parameter", takes]);
        }
        // A value the API refuses: the same message, word for word, on the page and from the API.
        for (page_path, api_path, field) in [
            ("/?op=silux", "/v1/kernels?op=silux", "op"),
            ("/field?arch=sm_9", "/v1/kernels?arch=sm_9", "arch"),
            ("/?dtype=f8", "/v1/kernels?dtype=f8", "dtype"),
        ] {
            let api = srv.client.get(srv.url(api_path)).send().await.unwrap();
            assert_eq!(api.status(), StatusCode::BAD_REQUEST, "{api_path}");
            let problem: Value = api.json().await.unwrap();
            let detail = problem["detail"].as_str().unwrap().to_string();
            assert!(
                detail.starts_with(&format!("query parameter `{field}`")),
                "{detail}"
            );
            let (st, body) = page(&srv, page_path).await;
            bad_page(page_path.to_string(), st, body, &[&escape(&detail)]);
        }
        // What the pages take still works.
        html_ok(
            &srv,
            "/?op=silu&dtype=bf16&arch=sm_90&limit=10&offset=0&uoffset=0",
        )
        .await;
        html_ok(&srv, "/field?op=silu&limit=5").await;
        html_ok(
            &srv,
            "/policy?policy=ulp:1&arch=sm_90&cols=4096&runtime=any",
        )
        .await;
        html_ok(&srv, &kpage).await;
    }
}

/// Measures the page once it is laid out: the visible width (the viewport less any scrollbar),
/// the page's scroll width, the right edge of every table, and every element whose right edge
/// lies past the visible width (a column off-screen, or cut by a scrolling wrapper). The result
/// is JSON in `#overflow-report`, with `<`, `>` and `&` written as JSON escapes so that it
/// reads back from `--dump-dom` unchanged.
const MEASURE: &str = r#"<script>
(function () {
  var de = document.documentElement, w = de.clientWidth, out = [];
  var all = document.body.getElementsByTagName('*');
  for (var i = 0; i < all.length; i++) {
    var e = all[i], r = e.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) continue;
    if (r.right > w + 0.5) {
      out.push({tag: e.tagName.toLowerCase(), id: e.id,
        cls: typeof e.className === 'string' ? e.className : '',
        right: Math.round(r.right), text: (e.textContent || '').trim().slice(0, 80)});
    }
  }
  var tables = [].map.call(document.querySelectorAll('table'), function (t) {
    return {id: t.id, right: Math.round(t.getBoundingClientRect().right)};
  });
  var res = {inner_width: window.innerWidth, client_width: w, scroll_width: de.scrollWidth,
    tables: tables, overflowing: out};
  var p = document.createElement('pre');
  p.id = 'overflow-report';
  p.textContent = JSON.stringify(res).replace(/[<>&]/g, function (c) {
    return '\\u' + ('000' + c.charCodeAt(0).toString(16)).slice(-4);
  });
  document.body.appendChild(p);
})();
</script>"#;

/// The widths the pages must fit: a common laptop's and a desktop's.
const WIDTHS: [u32; 2] = [1366, 1920];

/// Every page of a hub with its widest content (the fixture's kernels, kernels with the longest
/// name the manifest allows, verified and awaiting, a hostile description), in Chromium windows
/// 1366 and 1920 pixels wide: nothing lies past the right edge of the window — the page does
/// not scroll sideways and no table is cut by its scrolling wrapper. Each page is also
/// screenshotted at both widths (into a temporary directory, or KERNELIZE_SCREENSHOT_DIR).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_fit_1366_and_1920_wide() {
    let Some(chromium) = chromium() else { return };
    let profile = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let shots = match std::env::var_os("KERNELIZE_SCREENSHOT_DIR") {
        Some(d) => PathBuf::from(d),
        None => tmp.path().join("screenshots"),
    };
    std::fs::create_dir_all(&shots).unwrap();

    let (_b, srv) = populated(&[]).await;
    // The longest names a manifest allows (64 characters): two verified (the first claim
    // verifies silu_pending, queued first), one left awaiting verification.
    let long = |tag: &str| format!("silu_{tag}_{}", "x".repeat(64 - 6 - tag.len()));
    let submit_t = srv.token("submit");
    let worker = srv.token("worker");
    for (tag, desc) in [
        (
            "fast",
            "exact and fast, with the longest name a manifest allows",
        ),
        ("ulp", HOSTILE),
        (
            "wait",
            "never verified, with the longest name a manifest allows",
        ),
    ] {
        let name = long(tag);
        assert_eq!(name.len(), 64);
        submit(&srv, &submit_t, &name, desc, "/* long */").await;
    }
    verify_next(&srv, &worker, "exact", "sm_80").await;
    verify_next(&srv, &worker, "exact_fast", "sm_90").await;
    verify_next(&srv, &worker, "one_ulp_fast", "sm_90").await;

    // A hub with the bundled certificates too: their "verified" cells say when the GPU measured
    // and, for those imported on another day, the import's day on a second line.
    let bundled = TestServer::start(&Backend::sqlite(), &[]).await;
    let mut pages: Vec<(String, String)> = vec![
        ("overview".into(), "/".into()),
        ("field".into(), "/field".into()),
        ("policy".into(), "/policy".into()),
        (
            "policy-sm_90-8192".into(),
            "/policy?policy=bit_exact&dtype=bf16&arch=sm_90&cols=8192&rows=4096".into(),
        ),
        (
            "policy-ulp1-cuda".into(),
            "/policy?policy=ulp:1&arch=sm_90&cols=4096&runtime=cuda".into(),
        ),
        (
            "policy-unverified-width".into(),
            "/policy?policy=ulp:1&arch=sm_90&cols=5000".into(),
        ),
        ("error".into(), "/?op=silux".into()),
    ];
    for name in [
        "silu_exact".to_string(),
        "silu_off".into(),
        "silu_old".into(),
        "silu_pending".into(),
        "silu_compiled".into(),
        long("fast"),
        long("ulp"),
        long("wait"),
    ] {
        pages.push((
            format!("kernel-{}", &name[..name.len().min(12)]),
            format!("/kernels/{name}/1.0.0"),
        ));
    }

    let mut pages: Vec<(String, String, &TestServer)> = pages
        .into_iter()
        .map(|(name, path)| (name, path, &srv))
        .collect();
    pages.push(("overview-bundled".into(), "/".into(), &bundled));
    pages.push(("field-bundled".into(), "/field".into(), &bundled));

    let mut failures = Vec::new();
    for (name, path, srv) in &pages {
        let r = srv.client.get(srv.url(path)).send().await.unwrap();
        let html = r.text().await.unwrap();
        assert!(html.contains("</body>"), "{path}: {html}");
        // The page as served, with the measuring script at the end of its body, from a file
        // (the pages need nothing from the server: the stylesheet and the plots are inline).
        let file = tmp.path().join(format!("{name}.html"));
        std::fs::write(
            &file,
            html.replacen("</body>", &format!("{MEASURE}</body>"), 1),
        )
        .unwrap();
        for w in WIDTHS {
            let (dom, console) = browse_at(
                &chromium,
                profile.path(),
                (w, 900),
                "--dump-dom",
                &format!("file://{}", file.display()),
            );
            assert!(console.is_empty(), "{name} at {w}: console: {console:?}");
            let start = dom
                .find("<pre id=\"overflow-report\">")
                .unwrap_or_else(|| panic!("{name} at {w}: no measurement in {dom}"));
            let json = &dom[start + "<pre id=\"overflow-report\">".len()..];
            let json = &json[..json.find("</pre>").unwrap()];
            let m: Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}"));
            let tables: Vec<String> = m["tables"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| format!("#{} {}", t["id"].as_str().unwrap(), t["right"]))
                .collect();
            eprintln!(
                "{name:<24} {w}: visible {} scroll {} tables right edge [{}]",
                m["client_width"],
                m["scroll_width"],
                tables.join(", ")
            );
            assert_eq!(
                m["inner_width"],
                json!(w),
                "{name}: the window is not {w} wide"
            );
            let over = m["overflowing"].as_array().unwrap();
            if m["scroll_width"].as_u64() > m["client_width"].as_u64() || !over.is_empty() {
                let first: Vec<String> = over
                    .iter()
                    .filter(|e| {
                        matches!(
                            e["tag"].as_str(),
                            Some(
                                "td" | "th" | "table" | "form" | "p" | "pre" | "div" | "ul" | "dl"
                            )
                        )
                    })
                    .take(8)
                    .map(|e| {
                        format!(
                            "{} #{} .{} right {} `{}`",
                            e["tag"], e["id"], e["cls"], e["right"], e["text"]
                        )
                    })
                    .collect();
                failures.push(format!(
                    "{path} at {w}: scroll width {} > {}, {} elements past the right edge: {}",
                    m["scroll_width"],
                    m["client_width"],
                    over.len(),
                    first.join("; ")
                ));
            }
            let png = shots.join(format!("{name}-{w}.png"));
            let (_, console) = browse_at(
                &chromium,
                profile.path(),
                (w, 900),
                &format!("--screenshot={}", png.display()),
                &srv.url(path),
            );
            assert!(console.is_empty(), "{name} at {w}: console: {console:?}");
            let bytes =
                std::fs::read(&png).unwrap_or_else(|e| panic!("{name}: no screenshot: {e}"));
            assert!(bytes.starts_with(b"\x89PNG"), "{name} at {w}: not a PNG");
        }
    }
    assert!(
        failures.is_empty(),
        "columns off-screen:\n{}",
        failures.join("\n")
    );
}
