//! The bundled kernels (`kernels/`) against their release history (`kernels/released.toml`), and
//! `kernelize serve` starting on a database made by the previous release.
//!
//! A bundled kernel is stored by (name, version) and is immutable: a hub whose database holds a
//! released version refuses to start when the folder holds other content under that version.
//! So every change of content needs a version bump, and every version in the folder must be
//! recorded with its digest. `python/tests/test_bundled_kernels.py` checks the other half: every
//! kernels/<name>/ is exactly what kernels/generate.py writes from kernels/src/.

mod support;

use kernel_registry::KernelBundle;
use serde::Deserialize;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use support::{kernels_dir, repo_root, Backend, TestServer};

const HISTORY: &str = "kernels/released.toml";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct History {
    kernel: Vec<Released>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Released {
    name: String,
    version: String,
    digest: String,
    #[serde(default)]
    #[allow(dead_code)]
    note: Option<String>,
}

fn history() -> Vec<Released> {
    let path = repo_root().join(HISTORY);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (the bundled kernels' release history)",
            path.display()
        )
    });
    let h: History = toml::from_str(&text).unwrap_or_else(|e| panic!("{HISTORY}: {e}"));
    h.kernel
}

/// (folder, bundle) of every kernels/<name>/.
fn bundled() -> Vec<(PathBuf, KernelBundle)> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(kernels_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("kernel.toml").is_file())
        .collect();
    dirs.sort();
    dirs.into_iter()
        .map(|d| {
            let b = KernelBundle::load_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
            (d, b)
        })
        .collect()
}

fn entry_lines(name: &str, version: &str, digest: &str) -> String {
    format!("[[kernel]]\nname = \"{name}\"\nversion = \"{version}\"\ndigest = \"{digest}\"\n")
}

/// What is wrong between the bundled folders and the history, one paragraph each.
fn history_problems(kernels: &[(PathBuf, KernelBundle)], released: &[Released]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut by_key: BTreeMap<(&str, &str), &str> = BTreeMap::new();
    for r in released {
        if let Some(other) = by_key.insert((&r.name, &r.version), &r.digest) {
            problems.push(format!(
                "{HISTORY}: {} {} is listed twice ({other} and {}); the history is append-only and a version is released once: remove the entry you appended and give the kernel a new version",
                r.name, r.version, r.digest
            ));
        }
        if r.digest.parse::<kernel_registry::Digest>().is_err() {
            problems.push(format!(
                "{HISTORY}: {} {}: `{}` is not a digest (sha256:<64 hex digits>)",
                r.name, r.version, r.digest
            ));
        }
    }
    for (dir, b) in kernels {
        let m = &b.manifest;
        let (name, version, digest) = (m.name.as_str(), m.version.to_string(), b.digest());
        let folder = format!("kernels/{}", dir.file_name().unwrap().to_string_lossy());
        match by_key.get(&(name, version.as_str())) {
            Some(d) if *d == digest.as_str() => {}
            Some(d) => {
                // one above every version of this kernel released so far
                let mut next = released
                    .iter()
                    .filter(|r| r.name == name)
                    .filter_map(|r| semver::Version::parse(&r.version).ok())
                    .chain(std::iter::once(m.version.clone()))
                    .max()
                    .expect("at least the folder's version");
                next.patch += 1;
                next.pre = semver::Prerelease::EMPTY;
                next.build = semver::BuildMetadata::EMPTY;
                problems.push(format!(
                    "{folder}: content changed without a version bump: {name} {version} was released with digest {d}, the folder now has {digest}. A hub holding {name} {version} would refuse to start. Bump `version` in {folder}/kernel.toml (e.g. to {next}), run `python3 kernels/generate.py`, and append to {HISTORY} the entry this test then prints"
                ));
            }
            None => problems.push(format!(
                "{folder}: {name} {version} is not in {HISTORY}; append (never edit an existing entry):\n\n{}",
                entry_lines(name, &version, digest.as_str())
            )),
        }
        if let Some(newer) = released
            .iter()
            .filter(|r| r.name == name)
            .filter_map(|r| semver::Version::parse(&r.version).ok())
            .filter(|v| *v > m.version)
            .max()
        {
            problems.push(format!(
                "{folder}: version {version} is older than the released {name} {newer}; a kernel's version only goes up (use one above {newer})"
            ));
        }
    }
    problems
}

#[test]
fn every_bundled_kernel_version_is_released_with_its_content() {
    let kernels = bundled();
    assert!(
        kernels.len() >= 14,
        "only {} bundled kernels found in {}",
        kernels.len(),
        kernels_dir().display()
    );
    let problems = history_problems(&kernels, &history());
    assert!(
        problems.is_empty(),
        "the bundled kernels do not match {HISTORY}:\n\n{}",
        problems.join("\n\n")
    );
}

#[test]
fn the_history_check_names_a_changed_kernel_and_a_missing_version() {
    // The check itself, on a released kernel changed in place and on a new version.
    let kernels = bundled();
    let (dir, b) = kernels
        .iter()
        .find(|(_, b)| b.manifest.name == "silu")
        .expect("kernels/silu");
    let released = history();
    let changed =
        KernelBundle::from_parts(&b.manifest_toml, &format!("{}\n// changed\n", b.source)).unwrap();
    let p = history_problems(&[(dir.clone(), changed)], &released);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].contains("content changed without a version bump")
            && p[0].contains("kernels/silu/kernel.toml")
            && p[0].contains(HISTORY),
        "{}",
        p[0]
    );
    let v = b.manifest.version.to_string();
    let bumped = KernelBundle::from_parts(
        &b.manifest_toml
            .replace(&format!("version = \"{v}\""), "version = \"99.0.0\""),
        &b.source,
    )
    .unwrap();
    let p = history_problems(&[(dir.clone(), bumped.clone())], &released);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].contains("silu 99.0.0 is not in kernels/released.toml")
            && p[0].contains(&entry_lines("silu", "99.0.0", bumped.digest().as_str())),
        "{}",
        p[0]
    );
    // An entry appended twice, and a version going down.
    let mut twice = released.clone();
    twice.push(Released {
        digest: format!("sha256:{}", "0".repeat(64)),
        ..released[0].clone()
    });
    let p = history_problems(&[], &twice);
    assert!(p.iter().any(|l| l.contains("listed twice")), "{p:?}");
    let mut newer = released.clone();
    newer.push(Released {
        name: "silu".into(),
        version: "98.0.0".into(),
        digest: format!("sha256:{}", "1".repeat(64)),
        note: None,
    });
    let p = history_problems(&[(dir.clone(), b.clone())], &newer);
    assert!(
        p.iter()
            .any(|l| l.contains("older than the released silu 98.0.0")),
        "{p:?}"
    );
}

// ---- upgrade: `kernelize serve` on a database made by the previous release -------------------

/// The release the upgrade fixtures were made with (tests/fixtures/upgrade/make.py).
const PREVIOUS: &str = "c40acba";

fn fixture(ext: &str) -> PathBuf {
    repo_root().join(format!("tests/fixtures/upgrade/{PREVIOUS}.{ext}"))
}

/// (name, version, digest) of every stored kernel, read straight from the database.
async fn stored_kernels(db_url: &str) -> BTreeSet<(String, String, String)> {
    use sqlx::Row;
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(db_url).await.unwrap();
    let rows = sqlx::query("SELECT name, version, digest FROM kernels")
        .fetch_all(&pool)
        .await
        .unwrap();
    pool.close().await;
    rows.iter()
        .map(|r| (r.get("name"), r.get("version"), r.get("digest")))
        .collect()
}

/// Versions recorded in the database's sqlx migration table.
async fn applied_migrations(db_url: &str) -> BTreeSet<i64> {
    use sqlx::Row;
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(db_url).await.unwrap();
    let rows = sqlx::query("SELECT version FROM _sqlx_migrations WHERE success = TRUE")
        .fetch_all(&pool)
        .await
        .unwrap();
    pool.close().await;
    rows.iter().map(|r| r.get::<i64, _>("version")).collect()
}

/// Every stored verification's facts row against its report: the GPU figures the backward ops'
/// resolution keys on (`sm_count`, `threads_per_sm`; migration 0017 fills them from the reports
/// of an older database). Returns how many rows were compared.
async fn facts_hold_the_reports_gpu_figures(db_url: &str) -> usize {
    use sqlx::Row;
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(db_url).await.unwrap();
    let rows = sqlx::query(
        "SELECT f.verification_id, f.sm_count, f.threads_per_sm, v.report_json \
         FROM verification_facts f JOIN verifications v ON v.id = f.verification_id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    pool.close().await;
    for r in &rows {
        let report: Value = serde_json::from_str(&r.get::<String, _>("report_json")).unwrap();
        let id = r.get::<i64, _>("verification_id");
        for col in ["sm_count", "threads_per_sm"] {
            assert_eq!(
                r.get::<Option<i64>, _>(col),
                report["device"][col].as_i64(),
                "verification {id}: {col}"
            );
        }
        assert!(
            r.get::<Option<i64>, _>("sm_count").is_some(),
            "verification {id}: every report has an SM count"
        );
    }
    rows.len()
}

/// Versions of the migrations this checkout ships for a backend (whatever the latest is).
fn shipped_migrations(backend: &str) -> BTreeSet<i64> {
    let dir = repo_root().join("migrations").join(backend);
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            let (v, _) = name.split_once('_')?;
            name.ends_with(".sql").then(|| v.parse::<i64>().ok())?
        })
        .collect()
}

/// Start this checkout's `kernelize serve` (migrations, then the bundled kernels: the real
/// start-up path) on a database the previous release made, and check what it kept and added.
async fn serve_upgrades(b: &Backend, db_url: &str, backend: &str) {
    let before = stored_kernels(db_url).await;
    let released: BTreeSet<(String, String, String)> = history()
        .into_iter()
        .map(|r| (r.name, r.version, r.digest))
        .collect();
    assert_eq!(before.len(), 14, "the previous release bundled 14 kernels");
    for k in &before {
        assert!(
            released.contains(k),
            "{} {} ({}) is stored by the previous release but not recorded in {HISTORY}: the history must hold every released version",
            k.0,
            k.1,
            k.2
        );
    }
    let migrations_before = applied_migrations(db_url).await;
    let shipped = shipped_migrations(backend);
    assert!(
        !migrations_before.is_empty() && migrations_before.is_subset(&shipped),
        "fixture migrations {migrations_before:?} vs shipped {shipped:?}"
    );

    let srv = TestServer::start_on(b, db_url, &[]).await;
    let now: BTreeSet<(String, String, String)> = bundled()
        .iter()
        .map(|(_, k)| {
            let m = &k.manifest;
            (
                m.name.clone(),
                m.version.to_string(),
                k.digest().to_string(),
            )
        })
        .collect();
    let all: Value = srv.get_json("/v1/kernels?limit=500").await;
    let listed: BTreeSet<(String, String, String)> = all["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            let s = |f: &str| k[f].as_str().unwrap().to_string();
            (s("name"), s("version"), s("digest"))
        })
        .collect();
    let missing_old: Vec<_> = before.difference(&listed).collect();
    assert!(
        missing_old.is_empty(),
        "kernels of the previous release are gone: {missing_old:?}"
    );
    let missing_new: Vec<_> = now.difference(&listed).collect();
    assert!(
        missing_new.is_empty(),
        "bundled kernels of this checkout were not added: {missing_new:?}"
    );
    assert_eq!(
        all["total"].as_u64(),
        Some(before.union(&now).count() as u64),
        "nothing but the old and the new kernels"
    );
    // A new version is queued for verification unless a bundled certificate covers it (then it
    // has no job: issue 27 item 4); an old one keeps its jobs and verifications.
    let (name, version, _) = now.difference(&before).next().expect("a new version");
    let k: Value = srv.get_json(&format!("/v1/kernels/{name}/{version}")).await;
    let imported = support::has_imported_verification(&srv, name, version).await;
    if imported {
        assert_eq!(k["jobs"], serde_json::json!([]), "{k}");
    } else {
        assert_eq!(k["jobs"][0]["state"], "queued", "{k}");
    }
    let old: Value = srv.get_json("/v1/kernels/silu_and_mul/1.0.0").await;
    assert_eq!(
        old["verifications"].as_array().map(Vec::len),
        Some(1),
        "the previous release's verification of silu_and_mul 1.0.0 is kept: {old}"
    );
    assert_eq!(old["jobs"][0]["state"], "done", "{old}");
    // Every migration this checkout ships ran (others may be added after this test was written).
    assert_eq!(applied_migrations(db_url).await, shipped);
    // The previous release's verifications got their GPU figures from their reports (0017).
    assert!(facts_hold_the_reports_gpu_figures(db_url).await >= 6);

    // A second start on the upgraded database changes nothing.
    drop(srv);
    let again = TestServer::start_on(b, db_url, &[]).await;
    let all2: Value = again.get_json("/v1/kernels?limit=500").await;
    assert_eq!(all2["total"], all["total"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn serve_starts_on_a_sqlite_database_of_the_previous_release() {
    let b = Backend::sqlite();
    let Backend::Sqlite(tmp) = &b else {
        unreachable!()
    };
    let db = tmp.file().to_path_buf();
    std::fs::copy(fixture("sqlite"), &db).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (made by tests/fixtures/upgrade/make.py)",
            fixture("sqlite").display()
        )
    });
    serve_upgrades(&b, &b.url(), "sqlite").await;
}

/// Replay a `pg_dump` (plain SQL, psql meta-commands removed) into an empty database.
async fn restore_postgres(url: &str, dump: &Path) {
    use sqlx::Connection;
    let sql = std::fs::read_to_string(dump).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (made by tests/fixtures/upgrade/make.py)",
            dump.display()
        )
    });
    let mut c = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::raw_sql(&sql)
        .execute(&mut c)
        .await
        .unwrap_or_else(|e| panic!("replaying {}: {e}", dump.display()));
    c.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn serve_starts_on_a_postgres_database_of_the_previous_release() {
    let Some(b) = Backend::postgres().await else {
        return;
    };
    let url = b.url();
    restore_postgres(&url, &fixture("pg.sql")).await;
    serve_upgrades(&b, &url, "postgres").await;
}
