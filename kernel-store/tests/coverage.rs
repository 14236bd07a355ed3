//! Coverage recording and width jobs (issue 13), on SQLite and PostgreSQL alike: a stored
//! verification records exactly which (dtype, cols, rows) its cases ran; jobs carry a shape
//! list; at most one pending width job per (kernel, cols), and a cap on all of them.
//!
//! PostgreSQL: `KERNELIZE_TEST_POSTGRES`; skips loudly without a server unless
//! `KERNELIZE_REQUIRE_POSTGRES=1`.

use kernel_registry::report::tests_support::{case, report_with};
use kernel_registry::report::{coverage, CaseStatus, Coverage, ShapeRequest};
use kernel_registry::{DType, KernelBundle};
use kernel_store::{Holder, Inserted, JobState, Store, WidthJob};

/// The store's own callers claim without an API token.
fn holder(lease: &str) -> Holder<'_> {
    Holder {
        lease_id: lease,
        token_id: None,
        actor: "w",
    }
}

fn bundle(name: &str) -> KernelBundle {
    let toml = format!(
        r#"
name = "{name}"
version = "1.0.0"
op = "rms_norm"
semantics = "llama"
description = "test kernel"
authors = ["tests"]
license = "MIT"
source = "k.cu"
[entry]
bf16 = "k_bf16"
f16 = "k_f16"
[launch]
block = 256
grid = "per_row"
"#
    );
    let src = "extern \"C\" __global__ void k_bf16() {}\nextern \"C\" __global__ void k_f16() {}\n";
    KernelBundle::from_parts(&toml, src).unwrap()
}

async fn sqlite() -> (Store, kernel_store::testing::TempSqlite) {
    let db = kernel_store::testing::fresh_sqlite();
    (Store::open(&db.url).await.unwrap(), db)
}

async fn postgres() -> Option<Store> {
    let url = kernel_store::testing::fresh_postgres_url("coverage test").await?;
    Some(Store::open(&url).await.unwrap())
}

kernel_store::both_backends!(
    coverage_is_recorded_with_the_verification,
    width_jobs_carry_shapes_and_are_bounded,
);

/// A report for `k` whose cases are: bf16 at 4096 (rows 1, 7, 64), bf16 at 768 (rows 3),
/// f16 at 4096 (rows 2); plus a bf16 case at 11008 that errored and an f16 case at 5120 that
/// was not applicable — those two cover nothing.
fn report(k: &KernelBundle) -> kernel_registry::VerificationReport {
    let mut r = report_with(0, 0);
    r.kernel.digest = k.digest();
    let at = |dtype: DType, rows: u64, cols: u64, status: CaseStatus| {
        let mut c = case(&format!("{dtype}/{rows}x{cols}/normal"), dtype, 0, 0);
        c.rows = rows;
        c.cols = cols;
        c.status = status;
        c
    };
    r.cases = vec![
        at(DType::Bf16, 64, 4096, CaseStatus::Ran),
        at(DType::Bf16, 1, 4096, CaseStatus::Ran),
        at(DType::Bf16, 7, 4096, CaseStatus::Ran),
        at(DType::Bf16, 3, 768, CaseStatus::Ran),
        at(DType::F16, 2, 4096, CaseStatus::Ran),
        at(DType::Bf16, 1, 11008, CaseStatus::Error),
        at(DType::F16, 9, 5120, CaseStatus::NotApplicable),
    ];
    r
}

fn expected() -> Vec<Coverage> {
    let c = |dtype, cols, row_counts: Vec<u64>| Coverage {
        dtype,
        cols,
        rows_min: row_counts[0],
        rows_max: *row_counts.last().unwrap(),
        row_counts,
    };
    vec![
        c(DType::Bf16, 768, vec![3]),
        c(DType::Bf16, 4096, vec![1, 7, 64]),
        c(DType::F16, 4096, vec![2]),
    ]
}

async fn coverage_is_recorded_with_the_verification(s: Store) {
    let k = bundle("cov_k");
    s.insert_kernel(&k, "submitted", "tests").await.unwrap();
    let job = s.claim_job("w", None, 60_000).await.unwrap().unwrap();
    let r = report(&k);
    assert_eq!(coverage(&r), expected(), "derived from the cases that ran");
    let vid = s
        .complete_job(job.id, &holder(job.lease_id.as_deref().unwrap()), &r)
        .await
        .unwrap();
    // Stored with the verification, read back without the report.
    assert_eq!(s.coverage(vid, None).await.unwrap(), expected());
    assert_eq!(
        s.coverage(vid, Some(DType::F16)).await.unwrap(),
        expected()[2..].to_vec()
    );
    let bf16 = s.coverage(vid, Some(DType::Bf16)).await.unwrap();
    assert!(
        !bf16.iter().any(|c| c.cols == 11008),
        "an errored case covers nothing: {bf16:?}"
    );
    assert_eq!(
        s.scalar_raw("SELECT COUNT(*) FROM verification_coverage")
            .await
            .unwrap(),
        3
    );
    // Coverage is part of the immutable record.
    assert!(s
        .execute_raw("UPDATE verification_coverage SET cols = 11008")
        .await
        .is_err());

    // Verifications stored before the coverage table existed: `migrate` fills their rows from
    // the report JSON (simulated by removing the rows).
    s.execute_raw("DELETE FROM verification_coverage")
        .await
        .unwrap();
    assert!(s.coverage(vid, None).await.unwrap().is_empty());
    s.migrate().await.unwrap();
    assert_eq!(s.coverage(vid, None).await.unwrap(), expected());
    assert_eq!(
        s.backfill_coverage().await.unwrap(),
        0,
        "nothing left to fill"
    );
    assert_eq!(s.verification_archs(&k.digest()).await.unwrap().len(), 1);
}

async fn width_jobs_carry_shapes_and_are_bounded(s: Store) {
    let a = bundle("width_a");
    let b = bundle("width_b");
    for k in [&a, &b] {
        let Inserted::New { job_id, .. } = s.insert_kernel(k, "submitted", "tests").await.unwrap()
        else {
            panic!()
        };
        let full = s.job(job_id).await.unwrap().unwrap();
        assert!(full.shapes.is_empty() && full.width_cols.is_none());
        // The suite jobs are done first, so the claims below take the width jobs.
        let j = s.claim_job("w", None, 60_000).await.unwrap().unwrap();
        s.complete_job(j.id, &holder(j.lease_id.as_deref().unwrap()), &report(k))
            .await
            .unwrap();
    }
    let shape = ShapeRequest::new(11008, 1, 64).unwrap();
    let sm90: kernel_registry::Arch = "sm_90".parse().unwrap();
    let WidthJob::Queued(first) = s
        .queue_width_job(&a.digest(), shape, sm90, 2, "anon")
        .await
        .unwrap()
    else {
        panic!("expected a new job")
    };
    assert_eq!(first.shapes, vec![shape]);
    assert_eq!(first.width_cols, Some(11008));
    // The same width again (other rows too): the pending job is reused, not re-queued.
    let other_rows = ShapeRequest::new(11008, 1, 512).unwrap();
    for sh in [shape, other_rows] {
        match s
            .queue_width_job(&a.digest(), sh, sm90, 2, "anon")
            .await
            .unwrap()
        {
            WidthJob::Existing(j) => assert_eq!(j.id, first.id),
            other => panic!("expected the pending job, got {other:?}"),
        }
    }
    // Another width of the same kernel is another job; then the cap (2) is reached.
    let w2 = ShapeRequest::new(13824, 1, 64).unwrap();
    assert!(matches!(
        s.queue_width_job(&a.digest(), w2, sm90, 2, "anon")
            .await
            .unwrap(),
        WidthJob::Queued(_)
    ));
    assert!(matches!(
        s.queue_width_job(&b.digest(), shape, sm90, 2, "anon")
            .await
            .unwrap(),
        WidthJob::CapReached(2)
    ));
    // The width job is for the architecture the client asked about: a worker declaring none
    // or another does not get it; one of sm_90 gets it with its shape list. Once done, the
    // width can be queued again.
    assert!(s.claim_job("w", None, 60_000).await.unwrap().is_none());
    let sm80: kernel_registry::Arch = "sm_80".parse().unwrap();
    assert!(s
        .claim_job_on("w", None, 60_000, Some(sm80))
        .await
        .unwrap()
        .is_none());
    // (The same width on another architecture is another job: not capped here, being a test
    // of the key, it is queued with a higher cap.)
    assert!(matches!(
        s.queue_width_job(&a.digest(), shape, sm80, 10, "anon").await.unwrap(),
        WidthJob::Queued(ref j) if j.id != first.id && j.arch == Some(sm80)
    ));
    let claimed = s
        .claim_job_on("w", None, 60_000, Some(sm90))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claimed.arch, Some(sm90));
    assert_eq!(
        (claimed.id, claimed.shapes.clone()),
        (first.id, vec![shape])
    );
    assert!(matches!(
        s.queue_width_job(&a.digest(), shape, sm90, 10, "anon").await.unwrap(),
        WidthJob::Existing(ref j) if j.id == first.id && j.state == JobState::Running
    ));
    let mut r = report(&a);
    r.requested_shapes = vec![shape];
    r.cases.push({
        let mut c = case("bf16/5x11008/normal", DType::Bf16, 0, 0);
        c.rows = 5;
        c.cols = 11008;
        c
    });
    let vid = s
        .complete_job(
            claimed.id,
            &holder(claimed.lease_id.as_deref().unwrap()),
            &r,
        )
        .await
        .unwrap();
    let cov = s.coverage(vid, Some(DType::Bf16)).await.unwrap();
    assert!(cov
        .iter()
        .any(|c| c.cols == 11008 && c.row_counts == vec![5]));
    assert!(s
        .pending_width_job(&a.digest(), 11008, sm90)
        .await
        .unwrap()
        .is_none());
    assert!(matches!(
        s.queue_width_job(&a.digest(), shape, sm90, 10, "anon").await.unwrap(),
        WidthJob::Queued(ref j) if j.id != first.id
    ));
    let audit = s.audit_entries(100).await.unwrap();
    assert_eq!(
        audit
            .iter()
            .filter(|e| e.action == "job.queued_for_width")
            .count(),
        4
    );
}
