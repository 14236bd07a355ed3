//! Test support: a real `kernelize serve` process on an ephemeral port, on a fresh SQLite file
//! or a fresh PostgreSQL database, plus small kernels and recorded verifier reports.

#![allow(dead_code)]

use reqwest::StatusCode;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

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
    Sqlite(tempfile::TempDir),
    Postgres(String),
}

impl Backend {
    pub fn sqlite() -> Backend {
        Backend::Sqlite(tempfile::tempdir().unwrap())
    }

    /// A fresh PostgreSQL database; `None` (loudly) when there is no server, unless
    /// `KERNELIZE_REQUIRE_POSTGRES=1`.
    pub async fn postgres() -> Option<Backend> {
        kernel_registry::storage::testing::fresh_postgres_url("API test")
            .await
            .map(Backend::Postgres)
    }

    pub fn url(&self) -> String {
        match self {
            Backend::Sqlite(dir) => {
                format!("sqlite://{}", dir.path().join("kernelize.db").display())
            }
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

    pub async fn start_on(_b: &Backend, db_url: &str, extra: &[&str]) -> TestServer {
        let mut child = Command::new(bin())
            .args([
                "serve",
                "--db",
                db_url,
                "--bind",
                "127.0.0.1:0",
                "--kernels",
            ])
            .arg(kernels_dir())
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawning kernelize serve");
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
        let ctype = r
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
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
    r["kernel"]["digest"] = claim["kernel"]["digest"].clone();
    r["device"]["arch"] = Value::String(arch.into());
    r
}

pub async fn audit_actions(b: &Backend, db_url: &str) -> Vec<String> {
    let _ = b;
    let store = kernel_registry::storage::Store::connect(db_url)
        .await
        .unwrap();
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
            &serde_json::json!({"worker": "test-worker"}),
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
