//! The API under schemathesis: a real `kernelize serve` on SQLite and on PostgreSQL, fuzzed
//! from its own /openapi.json for a bounded time, failing on any 5xx, any status or content
//! type the document does not declare, any response that breaks its declared schema, any
//! request breaking a declared rule that is accepted, and any method not refused with 405.
//!
//! Ignored by `cargo test`: it needs schemathesis, which `python/ci-setup.sh` installs;
//! `scripts/test` runs it afterwards with `--ignored`. `KERNELIZE_SCHEMATHESIS` names the
//! `schemathesis` executable (default `python/.venv/bin/schemathesis`),
//! `KERNELIZE_SCHEMATHESIS_SECONDS` the time per backend (default 60) and
//! `KERNELIZE_SCHEMATHESIS_SEED` the seed: CI runs a fixed one so that its verdict is
//! repeatable; `random` explores (a failure prints its seed and a curl line to replay).

mod support;

use std::process::Command;
use support::{repo_root, Backend, TestServer};

/// Checks that hold for every request: positive_data_acceptance is left out because some
/// rules span fields and cannot be stated in OpenAPI (a semantics valid for one op only, a
/// manifest's content), and the resource checks because nothing here is deleted.
const EXCLUDED_CHECKS: &str =
    "positive_data_acceptance,use_after_free,ensure_resource_availability";

/// The seed CI fuzzes with (any fixed number: a run is repeatable, not tuned to pass).
const SEED: &str = "20261123";

fn schemathesis() -> String {
    std::env::var("KERNELIZE_SCHEMATHESIS").unwrap_or_else(|_| {
        repo_root()
            .join("python/.venv/bin/schemathesis")
            .display()
            .to_string()
    })
}

async fn fuzz(b: Backend, name: &str) {
    let st = schemathesis();
    let seconds = std::env::var("KERNELIZE_SCHEMATHESIS_SECONDS").unwrap_or_else(|_| "60".into());
    let seed = std::env::var("KERNELIZE_SCHEMATHESIS_SEED").unwrap_or_else(|_| SEED.into());
    let seed_args: Vec<&str> = if seed == "random" {
        Vec::new()
    } else {
        vec!["--seed", &seed]
    };
    // Writes unlimited: the fuzzer should reach the handlers, not the rate limit.
    let srv = TestServer::start(
        &b,
        &[
            "--write-rate-per-minute",
            "0",
            "--anonymous-rate-per-minute",
            "0",
        ],
    )
    .await;
    let admin = srv.token("admin");
    let work = tempfile::tempdir().unwrap();
    let out = Command::new(&st)
        .current_dir(work.path())
        .args([
            "run",
            &srv.url("/openapi.json"),
            "--header",
            &format!("Authorization: Bearer {admin}"),
            "--checks",
            "all",
            "--exclude-checks",
            EXCLUDED_CHECKS,
            "--max-time",
            &seconds,
            // One worker: hypothesis in several threads of Python 3.11 fails on its own
            // (`AST constructor recursion depth mismatch`).
            "--workers",
            "1",
            "--generation-database",
            "none",
            "--no-color",
        ])
        .args(&seed_args)
        .output()
        .unwrap_or_else(|e| {
            panic!("running {st}: {e} (install it with `bash python/ci-setup.sh`, or set KERNELIZE_SCHEMATHESIS)")
        });
    let text = String::from_utf8_lossy(&out.stdout);
    let cases = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with(|c: char| c.is_ascii_digit()) && l.contains(" generated"))
        .unwrap_or("no count")
        .to_string();
    assert!(
        out.status.success(),
        "schemathesis found problems on {name}:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        cases.contains("generated") && !cases.starts_with("0 "),
        "schemathesis ran no case on {name}:\n{text}"
    );
    // Straight to the stderr handle so that the count is seen in CI logs.
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "schemathesis on {name}: {cases}");
    assert_eq!(srv.get_json("/healthz").await["status"], "ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs schemathesis (python/ci-setup.sh); scripts/test runs it"]
async fn schemathesis_finds_nothing_on_sqlite() {
    fuzz(Backend::sqlite(), "SQLite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs schemathesis (python/ci-setup.sh); scripts/test runs it"]
async fn schemathesis_finds_nothing_on_postgres() {
    if let Some(b) = Backend::postgres().await {
        fuzz(b, "PostgreSQL").await;
    }
}
