//! The storage suite, run against SQLite and PostgreSQL alike.
//!
//! PostgreSQL: `KERNELIZE_TEST_POSTGRES` (default `postgres://postgres@127.0.0.1:5432/test`);
//! each test gets a fresh database. Without a server these tests skip loudly, unless
//! `KERNELIZE_REQUIRE_POSTGRES=1` (set by `.ci/run`), which makes them fail instead.

use kernel_registry::report::tests_support::report_with;
use kernel_registry::storage::{Inserted, KernelQuery, Store, StoreError};
use kernel_registry::{DType, KernelBundle, Op};
use std::time::Duration;

fn bundle(name: &str, version: &str, body: &str) -> KernelBundle {
    let toml = format!(
        r#"
name = "{name}"
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
    let src = format!("extern \"C\" __global__ void k_bf16() {{ {body} }}\n");
    KernelBundle::from_parts(&toml, &src).unwrap()
}

async fn sqlite() -> (Store, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("k.db").display());
    (Store::open(&url).await.unwrap(), dir)
}

/// A fresh PostgreSQL database, or `None` (loudly) when there is no server.
async fn postgres() -> Option<Store> {
    let url = kernel_registry::storage::testing::fresh_postgres_url("storage test").await?;
    Some(Store::open(&url).await.unwrap())
}

macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod on_sqlite { $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() { let (s, _dir) = super::sqlite().await; super::$name(s).await; }
        )* }
        mod on_postgres { $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() { if let Some(s) = super::postgres().await { super::$name(s).await; } }
        )* }
    };
}

both_backends!(
    kernels_are_immutable_and_idempotent,
    listing_filters_and_pages,
    sources_are_rechecked_on_read,
    schema_refuses_changes_to_records,
    jobs_lease_expire_and_complete_once,
    jobs_fail_after_their_last_attempt,
    concurrent_claims_take_each_job_once,
    tokens_store_only_hashes,
);

async fn kernels_are_immutable_and_idempotent(s: Store) {
    let k = bundle("silu_a", "1.0.0", "");
    let first = s.insert_kernel(&k, "submitted", "tests").await.unwrap();
    let Inserted::New { kernel, job_id } = &first else {
        panic!("expected new")
    };
    assert_eq!(kernel.digest, k.digest());
    assert_eq!(kernel.op, Op::Silu);
    assert_eq!(kernel.dtypes, vec![DType::Bf16]);
    // The resolver decides applicability from the row alone: it must equal the manifest's.
    assert_eq!(kernel.constraints(), k.manifest.constraints);
    let job = s.job(*job_id).await.unwrap().unwrap();
    assert_eq!((job.state.as_str(), job.attempts), ("queued", 0));

    // The same content again: a no-op returning the stored kernel, no second job.
    let again = s.insert_kernel(&k, "submitted", "tests").await.unwrap();
    assert!(matches!(again, Inserted::Existing(ref e) if e.id == kernel.id));
    assert_eq!(s.jobs_for_kernel(&k.digest()).await.unwrap().len(), 1);

    // The same name and version with other content: refused, nothing half-written.
    let changed = bundle("silu_a", "1.0.0", "/* changed */");
    let err = s
        .insert_kernel(&changed, "submitted", "tests")
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Conflict(ref m) if m.contains("already stored with other content")),
        "{err}"
    );
    assert!(s.source(&changed.digest()).await.unwrap().is_none());
    assert!(s
        .kernel_by_digest(&changed.digest())
        .await
        .unwrap()
        .is_none());

    // A new version is fine.
    s.insert_kernel(
        &bundle("silu_a", "1.0.1", "/* changed */"),
        "submitted",
        "tests",
    )
    .await
    .unwrap();
    let audit = s.audit_entries(10).await.unwrap();
    assert_eq!(
        audit
            .iter()
            .filter(|a| a.action == "kernel.created")
            .count(),
        2
    );
}

async fn listing_filters_and_pages(s: Store) {
    for i in 0..5 {
        s.insert_kernel(&bundle(&format!("k{i}"), "1.0.0", ""), "bundled", "tests")
            .await
            .unwrap();
    }
    let all = |limit, offset| KernelQuery {
        limit,
        offset,
        ..Default::default()
    };
    let (page, total) = s.list_kernels(&all(2, 0)).await.unwrap();
    assert_eq!((page.len(), total), (2, 5));
    let (rest, _) = s.list_kernels(&all(10, 2)).await.unwrap();
    assert_eq!(rest.len(), 3);
    assert!(page.iter().all(|p| rest.iter().all(|r| r.id != p.id)));

    let q = |op, dtype, arch: &str| KernelQuery {
        op: Some(op),
        dtype: Some(dtype),
        arch: Some(arch.parse().unwrap()),
        limit: 100,
        ..Default::default()
    };
    assert_eq!(
        s.list_kernels(&q(Op::Silu, DType::Bf16, "sm_90"))
            .await
            .unwrap()
            .1,
        5
    );
    assert_eq!(
        s.list_kernels(&q(Op::Silu, DType::F16, "sm_90"))
            .await
            .unwrap()
            .1,
        0
    );
    assert_eq!(
        s.list_kernels(&q(Op::Silu, DType::Bf16, "sm_80"))
            .await
            .unwrap()
            .1,
        0
    );
    assert_eq!(
        s.list_kernels(&q(Op::Gelu, DType::Bf16, "sm_90"))
            .await
            .unwrap()
            .1,
        0
    );
}

async fn sources_are_rechecked_on_read(s: Store) {
    let k = bundle("silu_src", "1.0.0", "");
    s.insert_kernel(&k, "submitted", "tests").await.unwrap();
    let got = s.source(&k.digest()).await.unwrap().unwrap();
    assert_eq!(got.source, k.source);
    assert_eq!(got.manifest_toml, k.manifest_toml);
    assert!(s
        .source(&kernel_registry::Digest::of_bytes(b"none"))
        .await
        .unwrap()
        .is_none());
}

async fn schema_refuses_changes_to_records(s: Store) {
    let k = bundle("silu_imm", "1.0.0", "");
    s.insert_kernel(&k, "submitted", "tests").await.unwrap();
    for sql in [
        "UPDATE sources SET source = 'evil'",
        "DELETE FROM sources",
        "UPDATE kernels SET version = '9.9.9'",
        "UPDATE audit_log SET actor = 'someone else'",
        "DELETE FROM audit_log",
    ] {
        let e = s.execute_raw(sql).await.expect_err(sql);
        assert!(
            e.to_string().contains("immutable") || e.to_string().contains("append-only"),
            "{sql}: {e}"
        );
    }
    // And the content is still what was written, digest-checked.
    assert_eq!(
        s.source(&k.digest()).await.unwrap().unwrap().source,
        k.source
    );
}

fn report_for(k: &KernelBundle) -> kernel_registry::VerificationReport {
    let mut r = report_with(0, 0);
    r.kernel.digest = k.digest();
    r
}

async fn jobs_lease_expire_and_complete_once(s: Store) {
    let k = bundle("silu_job", "1.0.0", "");
    let Inserted::New { job_id, .. } = s.insert_kernel(&k, "submitted", "tests").await.unwrap()
    else {
        panic!()
    };
    let a = s.claim_job("worker-a", 100).await.unwrap().unwrap();
    assert_eq!((a.id, a.attempts, a.state.as_str()), (job_id, 1, "running"));
    assert!(
        s.claim_job("worker-b", 100).await.unwrap().is_none(),
        "leased job claimed twice"
    );
    let lease_a = a.lease_id.clone().unwrap();
    assert!(s.heartbeat(job_id, &lease_a, 100).await.unwrap());

    // worker-a stops heart-beating: its lease expires and worker-b takes the job.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let b = s.claim_job("worker-b", 60_000).await.unwrap().unwrap();
    assert_eq!(
        (b.id, b.attempts, b.worker.as_deref()),
        (job_id, 2, Some("worker-b"))
    );
    assert!(
        !s.heartbeat(job_id, &lease_a, 100).await.unwrap(),
        "lost lease still heart-beats"
    );
    let late = s
        .complete_job(job_id, &lease_a, "worker-a", &report_for(&k))
        .await
        .unwrap_err();
    assert!(
        matches!(late, StoreError::Conflict(ref m) if m.contains("not held by this lease")),
        "{late}"
    );

    // A report for another kernel is refused.
    let other = bundle("silu_other", "1.0.0", "");
    let lease_b = b.lease_id.clone().unwrap();
    let wrong = s
        .complete_job(job_id, &lease_b, "worker-b", &report_for(&other))
        .await
        .unwrap_err();
    assert!(
        matches!(wrong, StoreError::Invalid(ref m) if m.contains("is for kernel")),
        "{wrong}"
    );

    let vid = s
        .complete_job(job_id, &lease_b, "worker-b", &report_for(&k))
        .await
        .unwrap();
    let twice = s
        .complete_job(job_id, &lease_b, "worker-b", &report_for(&k))
        .await
        .unwrap_err();
    assert!(
        matches!(twice, StoreError::Conflict(ref m) if m.contains("already complete")),
        "{twice}"
    );
    let v = s.verification(vid).await.unwrap().unwrap();
    assert_eq!(
        (v.exactness_class.as_str(), v.report.kernel.digest.clone()),
        ("bit_exact", k.digest())
    );
    assert_eq!(
        s.verifications_for_kernel(&k.digest()).await.unwrap().len(),
        1
    );
    assert_eq!(
        s.job(job_id).await.unwrap().unwrap().verification_id,
        Some(vid)
    );
    let latest = s
        .latest_verifications(Some(Op::Silu), Some("sm_90".parse().unwrap()))
        .await
        .unwrap();
    assert_eq!(latest.len(), 1);
    assert!(s
        .latest_verifications(None, Some("sm_80".parse().unwrap()))
        .await
        .unwrap()
        .is_empty());
}

async fn jobs_fail_after_their_last_attempt(s: Store) {
    let k = bundle("silu_fail", "1.0.0", "");
    let Inserted::New { job_id, .. } = s.insert_kernel(&k, "submitted", "tests").await.unwrap()
    else {
        panic!()
    };
    // Attempt 1 fails explicitly (re-queued), attempts 2 and 3 lose their leases.
    let j = s.claim_job("w", 60_000).await.unwrap().unwrap();
    let j = s
        .fail_job(job_id, j.lease_id.as_deref().unwrap(), "w", "no GPU")
        .await
        .unwrap();
    assert_eq!(j.state, "queued");
    for _ in 0..2 {
        s.claim_job("w", 10).await.unwrap().unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert!(s.claim_job("w", 10).await.unwrap().is_none());
    let j = s.job(job_id).await.unwrap().unwrap();
    assert_eq!((j.state.as_str(), j.attempts), ("failed", 3));
    assert!(j
        .last_error
        .unwrap()
        .contains("lease expired on the last attempt"));
}

async fn concurrent_claims_take_each_job_once(s: Store) {
    let n = 40;
    for i in 0..n {
        s.insert_kernel(&bundle(&format!("c{i}"), "1.0.0", ""), "submitted", "tests")
            .await
            .unwrap();
    }
    let mut tasks = Vec::new();
    for w in 0..4 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            while let Some(j) = s.claim_job(&format!("w{w}"), 60_000).await.unwrap() {
                mine.push(j.id);
            }
            mine
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort();
    let before = all.len();
    all.dedup();
    assert_eq!(
        (before, all.len()),
        (n, n),
        "every job claimed exactly once"
    );
}

async fn tokens_store_only_hashes(s: Store) {
    let t = s.create_token("ci", &["submit".into()]).await.unwrap();
    assert!(t.starts_with("kz_"));
    assert_eq!(
        s.token(&t).await.unwrap(),
        Some(("ci".into(), vec!["submit".into()]))
    );
    assert_eq!(s.token("kz_wrong").await.unwrap(), None);
    let count = |col: &str, v: &str| format!("SELECT COUNT(*) FROM api_tokens WHERE {col} = '{v}'");
    assert_eq!(
        s.scalar_raw(&count("token_hash", &t)).await.unwrap(),
        0,
        "plaintext token stored"
    );
    let hash = kernel_registry::storage::hash_token(&t);
    assert_eq!(s.scalar_raw(&count("token_hash", &hash)).await.unwrap(), 1);
}
