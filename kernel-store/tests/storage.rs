//! The storage suite, run against SQLite and PostgreSQL alike.
//!
//! PostgreSQL: `KERNELIZE_TEST_POSTGRES` (default `postgres://postgres@127.0.0.1:5432/test`);
//! each test gets a fresh database. Without a server these tests skip loudly, unless
//! `KERNELIZE_REQUIRE_POSTGRES=1` (set by `.ci/run`), which makes them fail instead.

use kernel_registry::report::tests_support::report_with;
use kernel_registry::{DType, KernelBundle, Op};
use kernel_store::{
    Expiry, Holder, Inserted, JobState, KernelQuery, Store, StoreError, TokenCheck,
};
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

async fn sqlite() -> (Store, kernel_store::testing::TempSqlite) {
    let db = kernel_store::testing::fresh_sqlite();
    (Store::open(&db.url).await.unwrap(), db)
}

/// A fresh PostgreSQL database, or `None` (loudly) when there is no server.
async fn postgres() -> Option<Store> {
    let url = kernel_store::testing::fresh_postgres_url("storage test").await?;
    Some(Store::open(&url).await.unwrap())
}

kernel_store::both_backends!(
    kernels_are_immutable_and_idempotent,
    listing_filters_and_pages,
    sources_are_rechecked_on_read,
    schema_refuses_changes_to_records,
    jobs_lease_expire_and_complete_once,
    jobs_fail_after_their_last_attempt,
    expired_leases_are_refused_and_each_claim_has_its_nonce,
    concurrent_claims_take_each_job_once,
    tokens_store_only_hashes,
    claims_are_bound_to_the_token_that_made_them,
    tokens_expire_list_and_revoke,
    text_the_database_cannot_hold_is_never_a_database_error,
    reports_with_and_without_speeds_are_recorded_in_any_order,
);

/// A holder with no token: the store's own callers (these tests) claim without one.
fn untokened(lease: &str) -> Holder<'_> {
    Holder {
        lease_id: lease,
        token_id: None,
        actor: "tests",
    }
}

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
    let a = s.claim_job("worker-a", None, 100).await.unwrap().unwrap();
    assert_eq!((a.id, a.attempts, a.state.as_str()), (job_id, 1, "running"));
    assert!(
        s.claim_job("worker-b", None, 100).await.unwrap().is_none(),
        "leased job claimed twice"
    );
    let lease_a = a.lease_id.clone().unwrap();
    s.heartbeat(job_id, &untokened(&lease_a), 100)
        .await
        .unwrap();

    // worker-a stops heart-beating: its lease expires and worker-b takes the job.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let b = s
        .claim_job("worker-b", None, 60_000)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (b.id, b.attempts, b.worker.as_deref()),
        (job_id, 2, Some("worker-b"))
    );
    let lost = s
        .heartbeat(job_id, &untokened(&lease_a), 100)
        .await
        .unwrap_err();
    assert!(
        matches!(lost, StoreError::Conflict(ref m) if m.contains("stop working on it")),
        "lost lease still heart-beats: {lost}"
    );
    let late = s
        .complete_job(job_id, &untokened(&lease_a), &report_for(&k))
        .await
        .unwrap_err();
    assert!(
        matches!(late, StoreError::Conflict(ref m) if m.contains("no longer held by this lease")),
        "{late}"
    );

    // A report for another kernel is refused.
    let other = bundle("silu_other", "1.0.0", "");
    let lease_b = b.lease_id.clone().unwrap();
    let wrong = s
        .complete_job(job_id, &untokened(&lease_b), &report_for(&other))
        .await
        .unwrap_err();
    assert!(
        matches!(wrong, StoreError::Invalid(ref m) if m.contains("is for kernel")),
        "{wrong}"
    );

    let vid = s
        .complete_job(job_id, &untokened(&lease_b), &report_for(&k))
        .await
        .unwrap();
    let twice = s
        .complete_job(job_id, &untokened(&lease_b), &report_for(&k))
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
    let f = |arch: &str| kernel_store::MatrixFilter {
        op: Some(Op::Silu),
        dtype: None,
        arch: Some(arch.parse().unwrap()),
    };
    let (rows, total) = s.matrix_page(f("sm_90"), 10, 0).await.unwrap();
    assert_eq!((rows.len(), total), (1, 1));
    assert_eq!(rows[0].kernel.digest, k.digest());
    assert_eq!(s.matrix_page(f("sm_80"), 10, 0).await.unwrap().1, 0);
}

/// Speeds are optional in a report (a shape too large for the device has none). Each mix of
/// present and absent speeds is recorded, in an order where one statement text sees both
/// (PostgreSQL once refused a float8 after a NULL bound as float4: a 500 on report).
async fn reports_with_and_without_speeds_are_recorded_in_any_order(s: Store) {
    let mixes = [
        (None, None),
        (Some(900.0), Some(1200.5)),
        (Some(1.0), None),
        (None, Some(2.0)),
        (None, None),
        (Some(3.5), Some(4.5)),
    ];
    // Twice over: the pool's connections each cache the statement.
    for (i, (a, b)) in mixes.iter().chain(mixes.iter()).copied().enumerate() {
        let k = bundle(&format!("silu_speed_{i}"), "1.0.0", "");
        s.insert_kernel(&k, "submitted", "tests").await.unwrap();
        let job = s.claim_job("worker", None, 60_000).await.unwrap().unwrap();
        let mut r = report_for(&k);
        r.summary.overall.gbps_4096x8192 = a;
        r.summary.overall.gbps_32768x4096 = b;
        let vid = s
            .complete_job(job.id, &untokened(job.lease_id.as_deref().unwrap()), &r)
            .await
            .unwrap_or_else(|e| panic!("speeds {a:?}, {b:?}: {e}"));
        let back = s.verification(vid).await.unwrap().unwrap().report;
        assert_eq!(
            (
                back.summary.overall.gbps_4096x8192,
                back.summary.overall.gbps_32768x4096
            ),
            (a, b)
        );
    }
}

/// Issue 26: a lease that expired is refused for heartbeat, report (`check_holder` and
/// `complete_job`) and fail, though no other worker claimed the job since; the job is left as
/// it was, for the next claim, which gets a new lease and a new nonce.
async fn expired_leases_are_refused_and_each_claim_has_its_nonce(s: Store) {
    let k = bundle("silu_expired", "1.0.0", "");
    let Inserted::New { job_id, .. } = s.insert_kernel(&k, "submitted", "tests").await.unwrap()
    else {
        panic!()
    };
    let a = s.claim_job("worker-a", None, 100).await.unwrap().unwrap();
    let nonce_a = a.claim_nonce.clone().unwrap();
    assert_eq!(nonce_a.len(), 32, "128 bits, hex: {nonce_a}");
    assert!(nonce_a.chars().all(|c| c.is_ascii_hexdigit()), "{nonce_a}");
    let lease_a = a.lease_id.clone().unwrap();
    // Held: it heart-beats and checks out.
    s.heartbeat(job_id, &untokened(&lease_a), 100)
        .await
        .unwrap();
    s.check_holder(job_id, &untokened(&lease_a)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    let expired = |e: StoreError| {
        assert!(
            matches!(e, StoreError::Conflict(ref m) if m.contains("lease expired")
                && m.contains("whether or not another worker has claimed the job")
                && m.contains("stop working on it")),
            "{e}"
        );
    };
    expired(
        s.heartbeat(job_id, &untokened(&lease_a), 60_000)
            .await
            .unwrap_err(),
    );
    expired(
        s.check_holder(job_id, &untokened(&lease_a))
            .await
            .unwrap_err(),
    );
    expired(
        s.complete_job(job_id, &untokened(&lease_a), &report_for(&k))
            .await
            .unwrap_err(),
    );
    expired(
        s.fail_job(job_id, &untokened(&lease_a), "gave up late")
            .await
            .unwrap_err(),
    );
    // Nothing changed: still running on the expired lease, no verification, no error.
    let j = s.job(job_id).await.unwrap().unwrap();
    assert_eq!(
        (j.state, j.attempts, j.verification_id, j.last_error),
        (JobState::Running, 1, None, None)
    );
    assert!(s
        .verifications_for_kernel(&k.digest())
        .await
        .unwrap()
        .is_empty());
    // The next claim (the same worker again) gets a new lease and a new nonce; the old lease
    // stays refused.
    let b = s
        .claim_job("worker-a", None, 60_000)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((b.id, b.attempts), (job_id, 2));
    let nonce_b = b.claim_nonce.clone().unwrap();
    assert_ne!(nonce_b, nonce_a);
    assert_ne!(b.lease_id.as_deref(), Some(lease_a.as_str()));
    assert!(matches!(
        s.heartbeat(job_id, &untokened(&lease_a), 60_000).await,
        Err(StoreError::Conflict(_))
    ));
    // A failed claim gives its nonce up; the claim after it has another.
    let lease_b = b.lease_id.clone().unwrap();
    let j = s
        .fail_job(job_id, &untokened(&lease_b), "no GPU")
        .await
        .unwrap();
    assert_eq!((j.state, j.claim_nonce), (JobState::Queued, None));
    let c = s
        .claim_job("worker-c", None, 60_000)
        .await
        .unwrap()
        .unwrap();
    let nonce_c = c.claim_nonce.clone().unwrap();
    assert!(nonce_c != nonce_a && nonce_c != nonce_b);
    s.complete_job(
        job_id,
        &untokened(c.lease_id.as_deref().unwrap()),
        &report_for(&k),
    )
    .await
    .unwrap();
}

async fn jobs_fail_after_their_last_attempt(s: Store) {
    let k = bundle("silu_fail", "1.0.0", "");
    let Inserted::New { job_id, .. } = s.insert_kernel(&k, "submitted", "tests").await.unwrap()
    else {
        panic!()
    };
    // Attempt 1 fails explicitly (re-queued), attempts 2 and 3 lose their leases.
    let j = s.claim_job("w", None, 60_000).await.unwrap().unwrap();
    let j = s
        .fail_job(job_id, &untokened(j.lease_id.as_deref().unwrap()), "no GPU")
        .await
        .unwrap();
    assert_eq!(j.state, JobState::Queued);
    for _ in 0..2 {
        s.claim_job("w", None, 10).await.unwrap().unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert!(s.claim_job("w", None, 10).await.unwrap().is_none());
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
            while let Some(j) = s.claim_job(&format!("w{w}"), None, 60_000).await.unwrap() {
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
    let (info, t) = s
        .create_token("ci", &["submit".into()], Expiry::Never, "admin")
        .await
        .unwrap();
    assert!(t.starts_with("kz_"));
    let TokenCheck::Valid(found) = s.check_token(&t).await.unwrap() else {
        panic!("a new token is valid")
    };
    assert_eq!(
        (found.id, found.name.as_str(), found.scopes.clone()),
        (info.id, "ci", vec!["submit".to_string()])
    );
    assert_eq!(found.expires_at, None, "created with Expiry::Never");
    assert_eq!(
        s.check_token("kz_wrong").await.unwrap(),
        TokenCheck::Unknown
    );
    let count = |col: &str, v: &str| format!("SELECT COUNT(*) FROM api_tokens WHERE {col} = '{v}'");
    assert_eq!(
        s.scalar_raw(&count("token_hash", &t)).await.unwrap(),
        0,
        "plaintext token stored"
    );
    let hash = kernel_store::hash_token(&t);
    assert_eq!(s.scalar_raw(&count("token_hash", &hash)).await.unwrap(), 1);
}

async fn audit_count(s: &Store, action: &str) -> usize {
    s.audit_entries(10_000)
        .await
        .unwrap()
        .iter()
        .filter(|e| e.action == action)
        .count()
}

/// Issue 17: a lease id is no credential. Another token presenting the right lease is refused
/// for heartbeat, report and fail (and audited); the claiming token is accepted.
async fn claims_are_bound_to_the_token_that_made_them(s: Store) {
    let k = bundle("silu_bound", "1.0.0", "");
    s.insert_kernel(&k, "submitted", "tests").await.unwrap();
    let worker = vec!["worker".to_string()];
    let (a, _) = s
        .create_token("worker-a", &worker, Expiry::Never, "admin")
        .await
        .unwrap();
    let (b, _) = s
        .create_token("worker-b", &worker, Expiry::Never, "admin")
        .await
        .unwrap();
    let job = s.claim_job("a", Some(a.id), 60_000).await.unwrap().unwrap();
    let lease = job.lease_id.clone().unwrap();
    assert_eq!(job.claim_token_id, Some(a.id));
    let as_b = Holder {
        lease_id: &lease,
        token_id: Some(b.id),
        actor: "worker-b",
    };
    let forbidden = |e: StoreError| match e {
        StoreError::Forbidden(m) => {
            assert!(
                m.contains("claimed by another worker token") && m.contains("audit log"),
                "{m}"
            );
        }
        other => panic!("expected Forbidden, got {other}"),
    };
    forbidden(s.heartbeat(job.id, &as_b, 60_000).await.unwrap_err());
    forbidden(
        s.complete_job(job.id, &as_b, &report_for(&k))
            .await
            .unwrap_err(),
    );
    forbidden(s.fail_job(job.id, &as_b, "sabotage").await.unwrap_err());
    forbidden(s.check_holder(job.id, &as_b).await.unwrap_err());
    // A token-less caller with the lease is no better.
    forbidden(
        s.complete_job(job.id, &untokened(&lease), &report_for(&k))
            .await
            .unwrap_err(),
    );
    assert_eq!(audit_count(&s, "job.claim_token_mismatch").await, 5);
    let j = s.job(job.id).await.unwrap().unwrap();
    assert_eq!(
        (j.state, j.verification_id),
        (JobState::Running, None),
        "nothing changed"
    );
    // The claiming token, with the lease, is accepted.
    let as_a = Holder {
        lease_id: &lease,
        token_id: Some(a.id),
        actor: "worker-a",
    };
    s.heartbeat(job.id, &as_a, 60_000).await.unwrap();
    assert_eq!(s.check_holder(job.id, &as_a).await.unwrap().id, job.id);
    s.complete_job(job.id, &as_a, &report_for(&k))
        .await
        .unwrap();
    assert_eq!(s.job(job.id).await.unwrap().unwrap().state, JobState::Done);
}

/// Tokens expire, are listed without secrets, and are revoked by id or name; a revoked
/// token's running jobs go back to the queue.
async fn tokens_expire_list_and_revoke(s: Store) {
    let worker = vec!["worker".to_string()];
    let (short, short_secret) = s
        .create_token("short", &worker, "1s".parse().unwrap(), "admin")
        .await
        .unwrap();
    assert!(short.expires_at.is_some());
    assert!(matches!(
        s.check_token(&short_secret).await.unwrap(),
        TokenCheck::Valid(_)
    ));
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let TokenCheck::Expired(t) = s.check_token(&short_secret).await.unwrap() else {
        panic!("a token past its expiry is expired")
    };
    assert_eq!(t.name, "short");

    let (w, w_secret) = s
        .create_token("gpu-1", &worker, Expiry::After { ms: 3_600_000 }, "admin")
        .await
        .unwrap();
    s.create_token("twin", &worker, Expiry::Never, "admin")
        .await
        .unwrap();
    s.create_token("twin", &worker, Expiry::Never, "admin")
        .await
        .unwrap();
    assert!(s
        .create_token("42", &worker, Expiry::Never, "admin")
        .await
        .is_err());
    let list = s.list_tokens().await.unwrap();
    assert_eq!(
        list.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
        ["short", "gpu-1", "twin", "twin"]
    );
    let used = list.iter().find(|t| t.id == short.id).unwrap();
    assert!(
        used.last_used_at.is_some(),
        "the valid check recorded a use"
    );
    let shown = serde_json::to_string(&list).unwrap();
    assert!(!shown.contains(&short_secret) && !shown.contains("token_hash"));

    // Revoking by an ambiguous name is refused; by id it works.
    let e = s.revoke_token("twin", "admin").await.unwrap_err();
    assert!(
        matches!(e, StoreError::Conflict(ref m) if m.contains("2 tokens are named `twin`")),
        "{e}"
    );
    assert!(matches!(
        s.revoke_token("nobody", "admin").await.unwrap_err(),
        StoreError::NotFound(_)
    ));

    // gpu-1 holds a job when it is revoked: the job is queued again, the attempt not counted.
    let k = bundle("silu_revoked", "1.0.0", "");
    s.insert_kernel(&k, "submitted", "tests").await.unwrap();
    let job = s
        .claim_job("gpu-1", Some(w.id), 60_000)
        .await
        .unwrap()
        .unwrap();
    let r = s.revoke_token("gpu-1", "admin").await.unwrap();
    assert_eq!((r.already, r.requeued_jobs.clone()), (false, vec![job.id]));
    assert!(matches!(
        s.check_token(&w_secret).await.unwrap(),
        TokenCheck::Revoked(_)
    ));
    let j = s.job(job.id).await.unwrap().unwrap();
    assert_eq!(
        (j.state, j.attempts, j.lease_id),
        (JobState::Queued, 0, None)
    );
    assert!(j
        .last_error
        .unwrap()
        .contains("`gpu-1` that claimed it was revoked"));
    let again = s.revoke_token(&w.id.to_string(), "admin").await.unwrap();
    assert!(again.already);
    assert_eq!(audit_count(&s, "token.created").await, 4);
    assert_eq!(audit_count(&s, "token.revoked").await, 1);
    assert_eq!(audit_count(&s, "job.requeued").await, 1);
}

/// A database of the release before migration 0004: a running job claimed without a token
/// and a token without an expiry. The upgrade queues the job again and gives the token the
/// default lifetime.
async fn upgrade_from_before_claim_tokens(s: Store) {
    s.migrate_to(2).await.unwrap();
    let k = bundle("silu_upgrade", "1.0.0", "");
    let Inserted::New { job_id, .. } = s.insert_kernel(&k, "submitted", "tests").await.unwrap()
    else {
        panic!()
    };
    let far = kernel_store::now_ms() + 3_600_000;
    s.execute_raw(&format!(
        "UPDATE verification_jobs SET state = 'running', attempts = 1, worker = 'old', \
         lease_id = 'old-lease', lease_expires_ms = {far} WHERE id = {job_id}"
    ))
    .await
    .unwrap();
    let secret = "kz_legacy";
    s.execute_raw(&format!(
        "INSERT INTO api_tokens (name, token_hash, scopes, created_at) \
         VALUES ('legacy', '{}', ',worker,', '2026-01-01T00:00:00Z')",
        kernel_store::hash_token(secret)
    ))
    .await
    .unwrap();

    s.migrate().await.unwrap();
    let j = s.job(job_id).await.unwrap().unwrap();
    assert_eq!(
        (j.state, j.attempts, j.lease_id.as_deref(), j.claim_token_id),
        (JobState::Queued, 0, None, None)
    );
    assert!(j.last_error.unwrap().contains("migration 0004"));
    assert_eq!(audit_count(&s, "job.requeued").await, 1);
    // The old worker's lease is gone: its report is refused as a lost lease.
    let e = s
        .complete_job(job_id, &untokened("old-lease"), &report_for(&k))
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::Conflict(_)), "{e}");
    let TokenCheck::Valid(t) = s.check_token(secret).await.unwrap() else {
        panic!("a legacy token keeps working after the upgrade")
    };
    let in_days = (t.expires_ms.unwrap() - kernel_store::now_ms()) as f64 / 86_400_000.0;
    assert!((89.9..=90.0).contains(&in_days), "{in_days}");
    // A worker claims it again, with its token.
    let again = s
        .claim_job("new", Some(t.id), 60_000)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((again.id, again.attempts), (job_id, 1));
    assert_eq!(again.claim_token_id, Some(t.id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn upgrade_from_before_claim_tokens_on_sqlite() {
    let db = kernel_store::testing::fresh_sqlite();
    upgrade_from_before_claim_tokens(Store::connect(&db.url).await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn upgrade_from_before_claim_tokens_on_postgres() {
    if let Some(url) = kernel_store::testing::fresh_postgres_url("upgrade test").await {
        upgrade_from_before_claim_tokens(Store::connect(&url).await.unwrap()).await;
    }
}

/// PostgreSQL refuses NUL in text where SQLite stores it: whatever a backend does with such
/// text, the store answers with a typed request error or a plain result, never `Db` (a 500).
async fn text_the_database_cannot_hold_is_never_a_database_error(s: Store) {
    let pg = s.backend() == kernel_store::Backend::Postgres;
    let r = s.kernel("a\0b", "1.0.0").await;
    match r {
        Ok(None) => assert!(!pg, "PostgreSQL looked up a NUL"),
        Err(StoreError::Unstorable(m)) => assert!(m.contains("U+0000"), "{m}"),
        other => panic!("a NUL in a lookup gave {other:?}"),
    }
    s.insert_kernel(&bundle("nul_test", "1.0.0", ""), "test", "tests")
        .await
        .unwrap();
    match s.claim_job("worker\0", None, 60_000).await {
        Ok(Some(job)) => assert!(!pg, "PostgreSQL stored a NUL: {job:?}"),
        Err(StoreError::Unstorable(m)) => assert!(pg, "{m}"),
        other => panic!("a NUL in a worker name gave {other:?}"),
    }
}
