//! Test support: a real `kernelize serve` process on an ephemeral port, on a fresh SQLite file
//! or a fresh PostgreSQL database, plus small kernels and recorded verifier reports.

#![allow(dead_code)]

use reqwest::StatusCode;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A problem document's `detail` (docs/spec.md: every error is one), or "" where it has none.
pub fn detail(p: &Value) -> &str {
    p["detail"].as_str().unwrap_or_default()
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

pub fn kernels_dir() -> PathBuf {
    repo_root().join("kernels")
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_kernelize")
}

/// Where a test's database lives.
pub enum Backend {
    Sqlite(kernel_store::testing::TempSqlite),
    Postgres(String),
}

impl Backend {
    pub fn sqlite() -> Backend {
        Backend::Sqlite(kernel_store::testing::fresh_sqlite())
    }

    /// A fresh PostgreSQL database; `None` (loudly) when there is no server, unless
    /// `KERNELIZE_REQUIRE_POSTGRES=1`.
    pub async fn postgres() -> Option<Backend> {
        kernel_store::testing::fresh_postgres_url("API test")
            .await
            .map(Backend::Postgres)
    }

    pub fn url(&self) -> String {
        match self {
            Backend::Sqlite(db) => db.url.clone(),
            Backend::Postgres(url) => url.clone(),
        }
    }
}

#[macro_export]
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod on_sqlite { $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() { super::$name(super::support::Backend::sqlite()).await; }
        )* }
        mod on_postgres { $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                if let Some(b) = super::support::Backend::postgres().await { super::$name(b).await; }
            }
        )* }
    };
}

pub struct TestServer {
    pub child: Child,
    pub base: String,
    pub db_url: String,
    pub client: reqwest::Client,
}

impl TestServer {
    pub async fn start(b: &Backend, extra: &[&str]) -> TestServer {
        Self::start_on(b, &b.url(), extra).await
    }

    pub async fn start_on(b: &Backend, db_url: &str, extra: &[&str]) -> TestServer {
        Self::spawn(b, db_url, extra, "warn", Stdio::inherit(), |_| {}).await
    }

    /// A server logging at `info` into the file `log` (its stderr).
    pub async fn start_logging_to(b: &Backend, extra: &[&str], log: &Path) -> TestServer {
        let file = std::fs::File::create(log)
            .unwrap_or_else(|e| panic!("creating the log file {}: {e}", log.display()));
        Self::spawn(b, &b.url(), extra, "info", Stdio::from(file), |_| {}).await
    }

    /// Start with a last say on the command (environment, resource limits).
    pub async fn start_with(
        b: &Backend,
        db_url: &str,
        extra: &[&str],
        configure: impl FnOnce(&mut Command),
    ) -> TestServer {
        Self::spawn(b, db_url, extra, "warn", Stdio::inherit(), configure).await
    }

    /// The hub accepts reports of every known suite here (`--min-suite-version 2026.1`, unless
    /// `extra` sets it): the recorded fixtures are real reports of suites 2026.1 and 2026.2.
    async fn spawn(
        _b: &Backend,
        db_url: &str,
        extra: &[&str],
        rust_log: &str,
        stderr: Stdio,
        configure: impl FnOnce(&mut Command),
    ) -> TestServer {
        let oldest: &[&str] = if extra.contains(&"--min-suite-version") {
            &[]
        } else {
            &[
                "--min-suite-version",
                kernel_registry::report::KNOWN_SUITES[0],
            ]
        };
        let mut cmd = Command::new(bin());
        cmd.args(["serve", "--db", db_url, "--bind", "127.0.0.1:0"]);
        // The repository's kernels unless `extra` names another folder.
        if !extra.contains(&"--kernels") {
            cmd.arg("--kernels").arg(kernels_dir());
        }
        // Most tests post recorded, unsigned reports: the hub accepts them here unless a test
        // of signing says `--signed-only` (not passed on), keeping the hub's default.
        let signed_only = extra.contains(&"--signed-only");
        cmd.args(oldest);
        if !signed_only {
            cmd.arg("--accept-unsigned-reports");
        }
        cmd.args(extra.iter().filter(|a| **a != "--signed-only"))
            .env("RUST_LOG", rust_log)
            .stdout(Stdio::piped())
            .stderr(stderr);
        configure(&mut cmd);
        let mut child = cmd.spawn().expect("spawning kernelize serve");
        let stdout = child.stdout.take().unwrap();
        let line = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            BufReader::new(stdout).read_line(&mut line).unwrap();
            line
        })
        .await
        .unwrap();
        let base = line
            .trim()
            .strip_prefix("kernelize listening on ")
            .unwrap_or_else(|| panic!("server did not start: `{line}`"))
            .to_string();
        TestServer {
            child,
            base,
            db_url: db_url.to_string(),
            client: reqwest::Client::new(),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A new token with one scope, created with the CLI as an operator would.
    pub fn token(&self, scope: &str) -> String {
        let out = Command::new(bin())
            .args([
                "token",
                "create",
                "--scope",
                scope,
                "--name",
                &format!("test-{scope}"),
                "--db",
                &self.db_url,
            ])
            .env("RUST_LOG", "warn")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        let r = self.client.get(self.url(path)).send().await.unwrap();
        let st = r.status();
        (st, r.json().await.unwrap_or(Value::Null))
    }

    /// A dashboard page: its status and body; an OK answer must be HTML.
    pub async fn get_page(&self, path: &str) -> (StatusCode, String) {
        let r = self.client.get(self.url(path)).send().await.unwrap();
        let st = r.status();
        let ctype = content_type(&r);
        let body = r.text().await.unwrap();
        if st == StatusCode::OK {
            assert!(ctype.starts_with("text/html"), "{path}: {ctype}");
        }
        (st, body)
    }

    pub async fn get_json(&self, path: &str) -> Value {
        let (st, v) = self.get(path).await;
        assert_eq!(st, StatusCode::OK, "GET {path}: {v}");
        v
    }

    pub async fn post_raw(
        &self,
        path: &str,
        token: Option<&str>,
        body: &Value,
    ) -> (StatusCode, Value, String) {
        let mut req = self.client.post(self.url(path)).json(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let r = req.send().await.unwrap();
        let st = r.status();
        let ctype = content_type(&r);
        (st, r.json().await.unwrap_or(Value::Null), ctype)
    }

    pub async fn post(&self, path: &str, token: &str, body: &Value) -> (StatusCode, Value) {
        let (st, v, _) = self.post_raw(path, Some(token), body).await;
        (st, v)
    }

    pub fn sigkill(&mut self) {
        self.child.kill().unwrap(); // SIGKILL on Unix
        self.child.wait().unwrap();
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A small valid silu kernel (manifest, source); `body` varies its content.
/// A response's `content-type` ("" when it has none).
fn content_type(r: &reqwest::Response) -> String {
    r.headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}

pub fn bundle_files(name: &str, version: &str, body: &str) -> (String, String) {
    let manifest = format!(
        r#"name = "{name}"
version = "{version}"
op = "silu"
description = "test kernel"
authors = ["tests"]
license = "MIT"
source = "k.cu"

[entry]
bf16 = "k_bf16"

[launch]
block = 256
grid = "per_element"
elements_per_thread = 4

[constraints]
archs = ["sm_90"]
"#
    );
    let source = format!("extern \"C\" __global__ void k_bf16() {{ {body} }}\n");
    (manifest, source)
}

/// A recorded verifier report from `tests/fixtures/reports/NAME.json`, re-targeted at the
/// kernel of a claimed job and at `arch`: what a worker would post after verifying it there.
pub fn recorded_report(name: &str, claim: &Value, arch: &str) -> Value {
    let path = repo_root().join(format!("tests/fixtures/reports/{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut r: Value = serde_json::from_str(&text).unwrap();
    retarget(&mut r, claim, arch);
    r
}

/// Make a report one the hub accepts for a claimed job (it checks every figure against the
/// job's kernel and the device, as it would a real worker's): the claimed kernel's name,
/// version, op, semantics and digest; the job's shapes; a device of `arch` (the report's own
/// when it has that arch, else the first known device of `arch`, with the copy bandwidth and
/// every speed scaled to 85% of its peak); per case, the element counts of the claimed op (its
/// outputs) and the bytes it must move, with the time that gives the case's GB/s. The cases'
/// exactness figures and GB/s are the report's.
pub fn retarget(r: &mut Value, claim: &Value, arch: &str) {
    use kernel_registry::{device, Arch, DType, Manifest};
    let m = Manifest::parse(claim["kernel"]["manifest_toml"].as_str().unwrap()).unwrap();
    let from_op: kernel_registry::Op = r["kernel"]["op"].as_str().unwrap().parse().unwrap();
    r["kernel"] = serde_json::json!({
        "name": m.name, "version": m.version.to_string(), "op": m.op, "semantics": m.semantics,
        "digest": claim["kernel"]["digest"],
    });
    r["requested_shapes"] = claim["job"]["shapes"].clone();
    // A worker of today audits what it compiled (docs/spec.md section 3b): a CUDA report with no
    // audit is one from before it, which every policy refuses. The fixtures' reports predate
    // it; a CUDA kernel's get a clean audit with the claimed manifest's declarations (a test of
    // the audit itself sets its own; a Python candidate's code is not audited).
    if r.get("capabilities").is_none() && m.runtime == kernel_registry::manifest::Runtime::Cuda {
        r["capabilities"] =
            serde_json::json!({"audited": true, "found": [], "declared": m.capabilities});
    }
    let want: Arch = arch.parse().unwrap();
    if r["device"]["arch"].as_str() != Some(arch) {
        let d = device::KNOWN_DEVICES
            .iter()
            .find(|d| d.arch == want)
            .unwrap_or_else(|| panic!("no known device of {arch}"));
        let old = r["device"]["copy_gbps"].as_f64().unwrap();
        let copy = old.min(0.85 * d.peak_dram_gbps);
        let f = copy / old;
        r["device"]["name"] = Value::String(format!("NVIDIA {}", d.model));
        r["device"]["arch"] = Value::String(arch.into());
        r["device"]["copy_gbps"] = serde_json::json!(copy);
        for c in r["cases"].as_array_mut().unwrap() {
            if let Some(s) = c.get_mut("speed").filter(|s| s.is_object()) {
                let gbps = s["gbps"].as_f64().unwrap() * f;
                s["gbps"] = serde_json::json!(gbps);
            }
        }
    }
    let copy = r["device"]["copy_gbps"].as_f64().unwrap();
    for c in r["cases"].as_array_mut().unwrap() {
        let dt: DType = c["dtype"].as_str().unwrap().parse().unwrap();
        let (rows, cols) = (c["rows"].as_u64().unwrap(), c["cols"].as_u64().unwrap());
        if !c["exactness"].is_object() {
            continue;
        }
        let (have, want) = (from_op.outputs(), m.op.outputs());
        if have != want {
            let e = &mut c["exactness"];
            for k in ["elements", "mismatches"] {
                e[k] = serde_json::json!(e[k].as_u64().unwrap() / have * want);
            }
            let hist: Vec<u64> = e["ulp_histogram"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n.as_u64().unwrap() / have * want)
                .collect();
            e["ulp_histogram"] = serde_json::json!(hist);
        }
        if let Some(s) = c.get_mut("speed").filter(|s| s.is_object()) {
            let gbps = s["gbps"].as_f64().unwrap();
            let speedup = s["speedup"].as_f64().unwrap();
            let bytes = m.op.bytes_moved(dt, rows, cols);
            let median_us = bytes as f64 / gbps / 1e3;
            s["bytes_moved"] = serde_json::json!(bytes);
            s["median_us"] = serde_json::json!(median_us);
            s["reference_median_us"] = serde_json::json!(median_us * speedup);
            s["gbps"] =
                serde_json::json!(kernel_registry::report::validate::gbps_of(bytes, median_us));
            s["copy_fraction"] = serde_json::json!(s["gbps"].as_f64().unwrap() / copy);
            s["speedup"] =
                serde_json::json!(s["reference_median_us"].as_f64().unwrap() / median_us);
        }
    }
}

/// Whether kernel `name@version` has an imported verification (a bundled certificate's: no
/// job of this hub, `job_id` null).
pub async fn has_imported_verification(srv: &TestServer, name: &str, version: &str) -> bool {
    srv.get_json(&format!("/v1/kernels/{name}/{version}/verifications"))
        .await["verifications"]
        .as_array()
        .unwrap()
        .iter()
        .any(|v| v.get("job_id") == Some(&serde_json::Value::Null))
}

/// How many verification jobs the hub's database holds (any state).
pub async fn job_count(db_url: &str) -> i64 {
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(db_url).await.unwrap();
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM verification_jobs")
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    n
}

pub async fn audit_actions(b: &Backend, db_url: &str) -> Vec<String> {
    let _ = b;
    let store = kernel_store::Store::connect(db_url).await.unwrap();
    let entries = store.audit_entries(10_000).await.unwrap();
    store.close().await;
    entries.into_iter().map(|e| e.action).collect()
}

/// Act as a GPU worker for one job: claim it, build the report from the claim with
/// `report`, post it, and return the job id and the server's answer.
pub async fn claim_and_report(
    srv: &TestServer,
    worker: &str,
    report: impl FnOnce(&Value) -> Value,
) -> (i64, Value) {
    let (st, claim) = srv
        .post(
            "/v1/jobs/claim",
            worker,
            // The recorded reports are of sm_90 GPUs: the worker says so, and gets the jobs
            // queued for sm_90 too (widths a client on sm_90 asked for).
            &serde_json::json!({"worker": "test-worker", "arch": "sm_90"}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{claim}");
    let job = claim["job"]["id"].as_i64().unwrap();
    let body = serde_json::json!({"lease_id": claim["lease_id"], "report": report(&claim)});
    let (st, r) = srv
        .post(&format!("/v1/jobs/{job}/report"), worker, &body)
        .await;
    assert_eq!(st, StatusCode::CREATED, "{r}");
    (job, r)
}
