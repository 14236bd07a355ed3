//! The index-backed reads (the verdict index's candidates and policy list, the dashboard's
//! matrix, the stale list) against their slow, obviously-right twins — every verification of
//! every kernel read in full and `Policy::evaluate` on each report, as the API did before
//! migration 0008 — on a mixed fixture (ops, semantics, archs, classes, superseded and stale verdicts, argmax models,
//! large differences, certificates for confirmed:N), on SQLite and PostgreSQL, fresh and upgraded.

use kernel_registry::capability::{
    Audit, Capability, CapabilityReport, DeclaredCapability, ModuleAudit,
};
use kernel_registry::cert::Certificate;
use kernel_registry::report::tests_support::case;
use kernel_registry::report::{
    speed_at, CaseReport, Coverage, ExactnessClass, ModelReport, Summary, Verdict, ULP_INFINITE,
};
use kernel_registry::{Arch, DType, KernelBundle, Op, Policy, Semantics, VerificationReport};
use kernel_store::{
    KernelQuery, KernelRow, MatrixFilter, RankingInput, Store, VerdictParts, VerificationRow,
};
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

fn bundle(i: usize) -> KernelBundle {
    let (op, semantics, grid) = match i % 3 {
        0 => (
            "silu",
            "",
            "grid = \"per_element\"\nelements_per_thread = 4",
        ),
        1 => (
            "rms_norm",
            "semantics = \"llama\"",
            "grid = \"per_row\"\nrows_per_block = 1",
        ),
        _ => (
            "rms_norm",
            "semantics = \"gemma\"",
            "grid = \"per_row\"\nrows_per_block = 1",
        ),
    };
    // Names out of insertion order, and two versions of one name.
    let name = if i == 22 {
        "k07".to_string() // kernel 1's name, another version
    } else {
        format!("k{:02}", (i * 7) % 24)
    };
    let version = if i == 22 { "2.0.0" } else { "1.0.0" };
    let toml = format!(
        "name = \"{name}\"\nversion = \"{version}\"\nop = \"{op}\"\n{semantics}\n\
         description = \"test kernel {i}\"\nauthors = [\"tests\"]\nlicense = \"MIT\"\n\
         source = \"k.cu\"\n[entry]\nbf16 = \"k_bf16\"\nf16 = \"k_f16\"\n\
         [launch]\nblock = 256\n{grid}\n"
    );
    let src = format!(
        "extern \"C\" __global__ void k_bf16() {{ /* {i} */ }}\n\
         extern \"C\" __global__ void k_f16() {{ }}\n"
    );
    KernelBundle::from_parts(&toml, &src).unwrap_or_else(|e| panic!("{toml}: {e}"))
}

fn model(dtype: DType, argmax: f64) -> ModelReport {
    serde_json::from_value(serde_json::json!({
        "model_name": "tiny", "model_digest": "d", "dtype": dtype, "tokens": 64,
        "layers_replaced": 2, "max_logit_abs_diff": 0.1, "argmax_match_fraction": argmax,
        "top5_overlap": 1.0, "mean_kl": 0.0,
    }))
    .unwrap()
}

/// The `j`-th verdict shape of the fixture: each exercises another part of a policy.
fn cases_for(j: usize, speed: f64) -> (Vec<CaseReport>, Vec<ModelReport>) {
    let mut bf = case("bf16/4096x8192/normal", DType::Bf16, 0, 0);
    let mut f16 = case("f16/4096x8192/normal", DType::F16, 0, 0);
    let mut models = vec![];
    match j % 12 {
        0 => {}
        1 => bf = case("bf16/4096x8192/normal", DType::Bf16, 10, 1),
        2 => bf = case("bf16/4096x8192/normal", DType::Bf16, 100, 3),
        3 => bf = case("bf16/4096x8192/normal", DType::Bf16, 500, ULP_INFINITE),
        4 => bf.deterministic = Some(false),
        5 => bf.batch_invariant = Some(false),
        6 => {
            bf = case("bf16/4096x8192/normal", DType::Bf16, 3, 2);
            // Reports are JSON: a NaN difference cannot be stored, a large one can.
            bf.exactness.as_mut().unwrap().max_abs_diff = 5.0;
        }
        7 => bf.integrity_failures = vec!["wrote outside the output".into()],
        8 => models = vec![model(DType::Bf16, 1.0), model(DType::F16, 0.75)],
        9 => models = vec![model(DType::Bf16, 0.5)],
        10 => f16 = case("f16/4096x8192/normal", DType::F16, 40, 2),
        _ => bf = case("bf16/4096x8192/normal", DType::Bf16, 60, 1),
    }
    let mut cases = vec![bf, f16];
    // A second, smaller timed shape so the nearest speed depends on the query.
    let mut small = case("bf16/64x1024/normal", DType::Bf16, 0, 0);
    (small.rows, small.cols) = (64, 1024);
    small.exactness = cases[0].exactness.clone();
    cases.push(small);
    for (n, c) in cases.iter_mut().enumerate() {
        if let Some(s) = c.speed.as_mut() {
            s.gbps = speed + n as f64;
        }
    }
    (cases, models)
}

fn report(k: &KernelBundle, arch: Arch, j: usize, speed: f64) -> VerificationReport {
    let mut r = kernel_registry::report::tests_support::report_with(0, 0);
    let (cases, models) = cases_for(j, speed);
    r.summary = Summary::from_cases(&cases);
    r.cases = cases;
    r.model = models;
    r.kernel.digest = k.digest();
    r.kernel.op = k.manifest.op;
    r.kernel.semantics = k.manifest.semantics;
    r.device.arch = arch;
    r.device.driver_version = ["570", "580"][j % 2].into();
    r.suite_version = ["1", "2"][(j / 2) % 2].into();
    // Measured before it was stored (imported), at a time of its own.
    r.started_at = format!("2025-12-{:02}T{:02}:{:02}:00Z", 1 + j % 28, j % 24, j % 60);
    if j.is_multiple_of(5) {
        r.summary.per_dtype.remove(&DType::F16);
    }
    r.capabilities = capabilities_for(j);
    r
}

/// The `j`-th capability audit of the fixture (docs/spec.md section 3b): none, clean, a
/// declared trap, a declared or undeclared clock, declared state, an incomplete audit.
fn capabilities_for(j: usize) -> Option<CapabilityReport> {
    let audit = |found: &[(Capability, &str)]| Audit {
        found: found
            .iter()
            .map(|(c, e)| (*c, [e.to_string()].into_iter().collect()))
            .collect(),
    };
    let declare = |cs: &[Capability]| -> Vec<DeclaredCapability> {
        cs.iter()
            .map(|c| DeclaredCapability {
                name: *c,
                reason: format!("needs {c}"),
            })
            .collect()
    };
    let (modules, declared): (Vec<ModuleAudit>, Vec<DeclaredCapability>) = match j % 7 {
        0 => return None,
        1 => (vec![(DType::Bf16, Ok(audit(&[])))], vec![]),
        2 => (
            vec![(DType::Bf16, Ok(audit(&[(Capability::Trap, "trap")])))],
            declare(&[Capability::Trap]),
        ),
        3 => (
            vec![(
                DType::F16,
                Ok(audit(&[
                    (Capability::Clock, "%globaltimer"),
                    (Capability::Trap, "trap"),
                ])),
            )],
            declare(&[Capability::Clock, Capability::Trap]),
        ),
        4 => (
            vec![(DType::Bf16, Ok(audit(&[(Capability::Clock, "%clock64")])))],
            vec![],
        ),
        5 => (
            vec![(
                DType::Bf16,
                Ok(audit(&[
                    (Capability::State, "st.global.u32 to launches"),
                    (Capability::Environment, "%smid"),
                ])),
            )],
            declare(&[Capability::Environment, Capability::State]),
        ),
        _ => (
            vec![
                (DType::Bf16, Ok(audit(&[]))),
                (DType::F16, Err("no PTX".into())),
            ],
            vec![],
        ),
    };
    Some(CapabilityReport::of_modules(&modules, &declared))
}

fn cert(key: &str, n: usize) -> Certificate {
    Certificate {
        claims: format!("{{\"n\":{n}}}"),
        key: key.into(),
        signature: format!("sig-{n}"),
    }
}

const SM80: Arch = Arch { major: 8, minor: 0 };
const SM90: Arch = Arch { major: 9, minor: 0 };
const SM100: Arch = Arch {
    major: 10,
    minor: 0,
};

/// 24 kernels over three op groups: some never verified, some on one arch or two, some
/// re-verified (the newest verdict differs from the older one), some certified by one or two
/// worker keys.
async fn fixture(s: &Store) {
    fixture_with(s, false).await
}

/// `fixture`, bringing the store's verdict index up to date after every write when `catch_up`
/// (so that it is built a write at a time).
async fn fixture_with(s: &Store, catch_up: bool) {
    let caught_up = || async {
        if catch_up {
            let g = s.answer_generation().await.unwrap();
            let index = s.verdict_index(g).await.unwrap();
            assert_eq!(index.generation(), Some(g));
        }
    };
    let mut n = 0;
    for i in 0..24 {
        let k = bundle(i);
        s.insert_kernel(&k, "submitted", "tests").await.unwrap();
        caught_up().await;
        if i % 6 == 5 {
            continue; // never verified
        }
        for (a, arch) in [SM90, SM80].into_iter().enumerate() {
            if a == 1 && i % 3 != 0 {
                continue;
            }
            let versions = 1 + (i + a) % 3;
            for v in 0..versions {
                n += 1;
                // `2 * (i / 3)`: so that the newest verdicts, too, take every verdict shape
                // (`j % 12`) and audit (`j % 7`) of the fixture.
                let j = i + 5 * v + a + 2 * (i / 3);
                let r = report(&k, arch, j, 1000.0 + ((i * 37 + v * 11) % 50) as f64 * 10.0);
                let c = match (i + v) % 4 {
                    0 => Some(cert("key-a", n)),
                    1 => Some(cert("key-b", n)),
                    _ => None,
                };
                s.seed_verification(&k.digest(), &r, c.as_ref())
                    .await
                    .unwrap();
                caught_up().await;
            }
        }
    }
}

fn policies() -> Vec<Policy> {
    [
        "bit_exact",
        "ulp:0",
        "ulp:1",
        "ulp:2",
        "ulp:18446744073709551615",
        "ulp:9223372036854775807",
        "tolerance",
        "argmax",
        "bit_exact,deterministic",
        "tolerance,batch_invariant",
        "ulp:4,max_abs_diff=0.01",
        "ulp:4,max_abs_diff=1",
        "tolerance,max_mismatch_fraction=0.05",
        "bit_exact,confirmed:2",
        "ulp:1,confirmed:1",
        "tolerance,confirmed:2",
        "bit_exact,allow:clock",
        "ulp:2,audited",
        "tolerance,allow:environment,allow:state",
        "tolerance,audited,allow:clock,allow:environment,allow:state",
    ]
    .iter()
    .map(|p| p.parse().unwrap())
    .collect()
}

async fn all_kernels(s: &Store, q: KernelQuery) -> Vec<KernelRow> {
    s.list_kernels(&KernelQuery {
        limit: i64::MAX,
        offset: 0,
        ..q
    })
    .await
    .unwrap()
    .0
}

/// The slow twin: every verification of the kernel, in full.
async fn newest_slow(s: &Store, k: &KernelRow, arch: Option<Arch>) -> Option<VerificationRow> {
    s.verifications_for_kernel(&k.digest)
        .await
        .unwrap()
        .into_iter()
        .filter(|v| arch.is_none_or(|a| v.arch == a))
        .max_by_key(|v| v.id)
}

/// Every verification of every kernel, in full, read once per comparison (the slow reads the
/// index is held to, without reading them again for every policy).
struct Reports {
    by_digest: HashMap<String, Vec<VerificationRow>>,
}

impl Reports {
    async fn read(s: &Store) -> Reports {
        let mut by_digest = HashMap::new();
        for k in all_kernels(s, KernelQuery::default()).await {
            let vs = s.verifications_for_kernel(&k.digest).await.unwrap();
            by_digest.insert(k.digest.to_string(), vs);
        }
        Reports { by_digest }
    }

    fn of(&self, k: &KernelRow) -> &[VerificationRow] {
        self.by_digest
            .get(k.digest.as_str())
            .map_or(&[], |v| v.as_slice())
    }

    fn newest(&self, k: &KernelRow, arch: Option<Arch>) -> Option<&VerificationRow> {
        self.of(k)
            .iter()
            .filter(|v| arch.is_none_or(|a| v.arch == a))
            .max_by_key(|v| v.id)
    }

    /// Distinct worker keys certifying `v`'s class on its arch for kernel `k` (`confirmed:N`).
    fn keys(&self, k: &KernelRow, v: &VerificationRow) -> usize {
        let mut keys: Vec<&str> = self
            .of(k)
            .iter()
            .filter(|w| w.arch == v.arch && w.exactness_class == v.exactness_class)
            .filter_map(|w| w.certificate.as_ref().map(|c| c.key.as_str()))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        keys.len()
    }
}

async fn keys_slow(s: &Store, k: &KernelRow, v: &VerificationRow) -> usize {
    s.certifying_keys(&k.digest, v.arch, &v.exactness_class)
        .await
        .unwrap()
        .len()
}

/// The verdict index's candidates of a resolve (each with its newest verification on the
/// arch, whether it meets the policy, its certifying keys, coverage, speeds and the lines that
/// say why not) against every verification read in full and `Policy::evaluate` on each report.
async fn resolve_candidates_match(s: &Store) {
    let g = s.answer_generation().await.unwrap();
    let index = s.verdict_index(g).await.unwrap();
    assert!(index.generation().is_some_and(|h| h >= g));
    let reports = Reports::read(s).await;
    // The stored parts, coverage and certifying keys of each verification read (once each).
    let mut parts: HashMap<(i64, DType), VerdictParts> = HashMap::new();
    let mut coverage: HashMap<(i64, DType), Vec<Coverage>> = HashMap::new();
    let mut keys: HashMap<i64, usize> = HashMap::new();
    let groups = [
        (Op::Silu, Semantics::Default),
        (Op::RmsNorm, Semantics::Llama),
        (Op::RmsNorm, Semantics::Gemma),
        (Op::LayerNorm, Semantics::Default),
    ];
    for (op, sem) in groups {
        let kernels = all_kernels(
            s,
            KernelQuery {
                op: Some(op),
                semantics: Some(sem),
                ..Default::default()
            },
        )
        .await;
        for arch in [SM90, SM80, SM100] {
            for dtype in [DType::Bf16, DType::F16, DType::F32] {
                let free = index.policy_free_inputs(op, sem, arch, dtype);
                for p in policies() {
                    let fast = index.newest_verdicts(op, sem, arch, dtype, &p);
                    let names: Vec<_> = fast.iter().map(|c| c.kernel.id).collect();
                    let want: Vec<_> = kernels.iter().map(|k| k.id).collect();
                    assert_eq!(names, want, "candidates in list order");
                    // A resolve's inputs: the candidates with their coverage and timed cases.
                    let ids: Vec<i64> = fast
                        .iter()
                        .filter_map(|c| c.on.as_ref().map(|v| v.verification_id))
                        .collect();
                    let mut cov = index.coverage_of(&ids, dtype);
                    let mut speeds = index.speeds_of(&ids, dtype);
                    let composed: Vec<RankingInput> = fast
                        .iter()
                        .map(|c| {
                            let id = c.on.as_ref().map(|v| v.verification_id);
                            RankingInput {
                                coverage: id
                                    .and_then(|id| cov.remove(&id))
                                    .unwrap_or_else(|| Arc::from([])),
                                speeds: id
                                    .and_then(|id| speeds.remove(&id))
                                    .map_or_else(|| Arc::from([]), Arc::from),
                                candidate: c.clone(),
                            }
                        })
                        .collect();
                    assert_eq!(
                        index.ranking_inputs(op, sem, arch, dtype, &p),
                        composed,
                        "{op} {sem} {arch} {dtype} `{p}`"
                    );
                    // The same without a policy: the check decides as the policy's read did.
                    assert_eq!(free.len(), fast.len());
                    for ((input, check), c) in free.iter().zip(&fast) {
                        let mut with_policy = input.candidate.clone();
                        if let (Some(on), Some(want)) = (with_policy.on.as_mut(), c.on.as_ref()) {
                            on.passes = check.as_ref().is_some_and(|ch| ch.passes(&p));
                            if p.confirmations == 0 {
                                on.certifying_keys = want.certifying_keys;
                            }
                        }
                        assert_eq!(&with_policy, c, "{op} {sem} {arch} {dtype} `{p}` free");
                    }
                    for (c, k) in fast.iter().zip(&kernels) {
                        assert_eq!(
                            (
                                &c.kernel.name,
                                &c.kernel.version,
                                &c.kernel.digest,
                                &c.kernel.dtypes
                            ),
                            (&k.name, &k.version, &k.digest, &k.dtypes)
                        );
                        assert_eq!(c.kernel.constraints, k.constraints());
                    }
                    for (c, k) in fast.iter().zip(&kernels) {
                        let ctx = format!("{} {arch} {dtype} `{p}`", k.name);
                        let slow = reports.newest(k, Some(arch));
                        match (&c.on, slow) {
                            (None, None) => {
                                let mut elsewhere: Vec<String> =
                                    reports.of(k).iter().map(|v| v.arch.to_string()).collect();
                                elsewhere.sort();
                                elsewhere.dedup();
                                let got: Vec<String> =
                                    c.elsewhere.iter().map(|a| a.to_string()).collect();
                                assert_eq!(got, elsewhere, "{ctx}");
                            }
                            (Some(on), Some(v)) => {
                                assert_eq!(on.verification_id, v.id, "{ctx}");
                                assert_eq!(&*on.class, v.exactness_class, "{ctx}");
                                assert_eq!(&*on.suite_version, v.report.suite_version, "{ctx}");
                                assert_eq!(
                                    &*on.driver_version, v.report.device.driver_version,
                                    "{ctx}"
                                );
                                assert_eq!(&*on.device_name, v.device_name, "{ctx}");
                                assert_eq!(&*on.created_at, v.created_at, "{ctx}");
                                let slow = p.evaluate(&v.report, dtype);
                                assert_eq!(on.passes, slow.is_ok(), "{ctx}: {slow:?}");
                                if let Entry::Vacant(e) = parts.entry((v.id, dtype)) {
                                    let stored = s
                                        .verdict_parts(&[v.id], dtype)
                                        .await
                                        .unwrap()
                                        .remove(&v.id)
                                        .unwrap();
                                    e.insert(stored);
                                }
                                let stored = &parts[&(v.id, dtype)];
                                assert_eq!(
                                    stored.why_not(&p, dtype),
                                    slow.clone().err().unwrap_or_default(),
                                    "{ctx}"
                                );
                                assert_eq!(
                                    stored.verdict.as_ref(),
                                    v.report.summary.per_dtype.get(&dtype),
                                    "{ctx}"
                                );
                                // The index holds the stored parts.
                                let held =
                                    index.verdict_parts(&[v.id], dtype).remove(&v.id).unwrap();
                                assert_eq!(&*held, stored, "{ctx}");
                                assert_eq!(
                                    held.why_not(&p, dtype),
                                    slow.err().unwrap_or_default(),
                                    "{ctx}"
                                );
                                if p.confirmations > 0 {
                                    if let Entry::Vacant(e) = keys.entry(v.id) {
                                        e.insert(keys_slow(s, k, v).await);
                                    }
                                    assert_eq!(keys[&v.id], reports.keys(k, v), "{ctx}");
                                    assert_eq!(on.certifying_keys as usize, keys[&v.id], "{ctx}");
                                }
                                // Speeds and coverage by index equal the report's.
                                let speeds = index.speeds_of(&[v.id], dtype);
                                for (rows, cols) in
                                    [(Some(4096), 8192), (Some(64), 1000), (None, 2048)]
                                {
                                    let fast = kernel_registry::report::nearest_speed(
                                        speeds.get(&v.id).cloned().unwrap_or_default(),
                                        rows,
                                        cols,
                                    );
                                    assert_eq!(
                                        fast,
                                        speed_at(&v.report, dtype, rows, cols),
                                        "{ctx}"
                                    );
                                }
                                if let Entry::Vacant(e) = coverage.entry((v.id, dtype)) {
                                    e.insert(s.coverage(v.id, Some(dtype)).await.unwrap());
                                }
                                assert_eq!(
                                    index
                                        .coverage_of(&[v.id], dtype)
                                        .remove(&v.id)
                                        .unwrap_or_default(),
                                    coverage[&(v.id, dtype)].clone().into(),
                                    "{ctx}"
                                );
                            }
                            (fast, slow) => panic!("{ctx}: fast {fast:?}, slow {slow:?}"),
                        }
                    }
                }
            }
        }
    }
}

/// The policy list as the API computed it before: filter every kernel by its newest
/// verification read in full, then page.
async fn approved_slow(
    s: &Store,
    reports: &Reports,
    q: &KernelQuery,
    p: &Policy,
) -> Vec<KernelRow> {
    let mut out = vec![];
    for k in all_kernels(s, q.clone()).await {
        let Some(v) = reports.newest(&k, q.arch) else {
            continue;
        };
        let dts = q.dtype.map(|d| vec![d]).unwrap_or_else(|| k.dtypes.clone());
        if reports.keys(&k, v) >= p.confirmations as usize
            && dts.iter().any(|d| p.evaluate(&v.report, *d).is_ok())
        {
            out.push(k);
        }
    }
    out
}

/// The policy list from the verdict index (`VerdictIndex::approved_ids`, its pages read by id
/// as the API does) against the reports.
async fn policy_list_matches(s: &Store) {
    let g = s.answer_generation().await.unwrap();
    let index = s.verdict_index(g).await.unwrap();
    let reports = Reports::read(s).await;
    for p in policies() {
        for (op, semantics) in [
            (None, None),
            (Some(Op::RmsNorm), None),
            (Some(Op::RmsNorm), Some(Semantics::Gemma)),
            (Some(Op::Silu), None),
        ] {
            for dtype in [None, Some(DType::Bf16), Some(DType::F16), Some(DType::F32)] {
                for arch in [None, Some(SM90), Some(SM80), Some(SM100)] {
                    let q = KernelQuery {
                        op,
                        semantics,
                        dtype,
                        arch,
                        limit: 1000,
                        offset: 0,
                    };
                    let ctx = format!("`{p}` {op:?} {semantics:?} {dtype:?} {arch:?}");
                    let slow = approved_slow(s, &reports, &q, &p).await;
                    // The ids of the whole list (whatever the page), read back by id in their
                    // order.
                    let ids = index.approved_ids(&q, &p);
                    assert_eq!(ids.len(), slow.len(), "{ctx} ids");
                    assert_eq!(s.kernels_by_ids(&ids).await.unwrap(), slow, "{ctx}");
                    let page = &ids[ids.len() / 3..];
                    assert_eq!(
                        s.kernels_by_ids(page).await.unwrap(),
                        slow[ids.len() / 3..],
                        "{ctx} by ids"
                    );
                    // Pages of 3 add up to the whole.
                    let mut paged = vec![];
                    for page in ids.chunks(3) {
                        paged.extend(s.kernels_by_ids(page).await.unwrap());
                    }
                    assert_eq!(paged, slow, "{ctx} paged");
                }
            }
        }
    }
}

/// Kernels verified, kernels bit-exact and the best bit-exact GB/s of one glance cell.
type Cell = (BTreeSet<i64>, BTreeSet<i64>, Option<f64>);

type SlowRow = (
    String,
    String,
    DType,
    Arch,
    ExactnessClass,
    Option<f64>,
    Verdict,
    // When the GPU measured it (the report's `started_at`) and when this hub imported it.
    (String, Option<String>),
);

/// The dashboard's matrix as it was computed before: every verification of every kernel.
async fn matrix_slow(s: &Store, f: MatrixFilter) -> (Vec<SlowRow>, Vec<(String, Vec<Arch>, bool)>) {
    let mut rows: Vec<(KernelRow, SlowRow)> = vec![];
    let mut unverified = vec![];
    for k in all_kernels(
        s,
        KernelQuery {
            op: f.op,
            dtype: f.dtype,
            ..Default::default()
        },
    )
    .await
    {
        let vs = s.verifications_for_kernel(&k.digest).await.unwrap();
        let mut newest: BTreeMap<Arch, &VerificationRow> = BTreeMap::new();
        for v in &vs {
            let e = newest.entry(v.arch).or_insert(v);
            if v.id > e.id {
                *e = v;
            }
        }
        newest.retain(|a, _| f.arch.is_none_or(|want| *a == want));
        if newest.is_empty() {
            let only_on: BTreeSet<Arch> = vs.iter().map(|v| v.arch).collect();
            unverified.push((k.name.clone(), only_on.into_iter().collect(), false));
            continue;
        }
        let before = rows.len();
        for (a, v) in newest {
            for (dt, verdict) in &v.report.summary.per_dtype {
                if f.dtype.is_some_and(|want| want != *dt) {
                    continue;
                }
                let speed = speed_at(&v.report, *dt, Some(4096), 8192).map(|s| s.gbps);
                rows.push((
                    k.clone(),
                    (
                        k.name.clone(),
                        k.version.clone(),
                        *dt,
                        a,
                        verdict.class,
                        speed,
                        verdict.clone(),
                        (
                            v.report.started_at.clone(),
                            v.job_id.is_none().then(|| v.created_at.clone()),
                        ),
                    ),
                ));
            }
        }
        if rows.len() == before && f.dtype.is_none() {
            unverified.push((k.name.clone(), vec![], true));
        }
    }
    rows.sort_by(|(ka, a), (kb, b)| {
        (ka.op, ka.semantics, a.2, a.3, a.4)
            .cmp(&(kb.op, kb.semantics, b.2, b.3, b.4))
            .then_with(|| b.5.unwrap_or(0.0).total_cmp(&a.5.unwrap_or(0.0)))
            .then_with(|| a.0.cmp(&b.0))
    });
    (rows.into_iter().map(|(_, r)| r).collect(), unverified)
}

fn same_verdict(a: &Verdict, b: &Verdict) -> bool {
    // NaN compares unequal to itself: compare the JSON (NaN is written as null).
    serde_json::to_string(a).unwrap() == serde_json::to_string(b).unwrap()
}

async fn matrix_matches(s: &Store) {
    for op in [None, Some(Op::Silu), Some(Op::RmsNorm)] {
        for dtype in [None, Some(DType::Bf16), Some(DType::F16)] {
            for arch in [None, Some(SM90), Some(SM80), Some(SM100)] {
                let f = MatrixFilter { op, dtype, arch };
                let ctx = format!("{f:?}");
                let (slow, slow_unverified) = matrix_slow(s, f).await;
                let (fast, total) = s.matrix_page(f, 1000, 0).await.unwrap();
                assert_eq!(total as usize, slow.len(), "{ctx}");
                assert_eq!(fast.len(), slow.len(), "{ctx}");
                for (x, y) in fast.iter().zip(&slow) {
                    assert_eq!(
                        (
                            &x.kernel.name,
                            &x.kernel.version,
                            x.dtype,
                            x.arch,
                            x.verdict.class
                        ),
                        (&y.0, &y.1, y.2, y.3, y.4),
                        "{ctx}"
                    );
                    assert_eq!(x.speed.as_ref().map(|s| s.gbps), y.5, "{ctx}");
                    assert!(same_verdict(&x.verdict, &y.6), "{ctx}");
                    assert_eq!(
                        (&x.verified_at, &x.imported_at),
                        (&y.7 .0, &y.7 .1),
                        "{ctx}"
                    );
                }
                let mut paged = vec![];
                for offset in (0..slow.len().max(1)).step_by(4) {
                    let (page, t) = s.matrix_page(f, 4, offset as i64).await.unwrap();
                    assert_eq!(t, total);
                    paged.extend(page.into_iter().map(|r| (r.kernel.id, r.dtype, r.arch)));
                }
                let whole: Vec<_> = fast
                    .iter()
                    .map(|r| (r.kernel.id, r.dtype, r.arch))
                    .collect();
                assert_eq!(paged, whole, "{ctx} paged");

                // At a glance: per op, semantics and dtype.
                let mut cells: BTreeMap<(Op, Semantics, DType), Cell> = BTreeMap::new();
                for r in &fast {
                    let c = cells
                        .entry((r.kernel.op, r.kernel.semantics, r.dtype))
                        .or_default();
                    c.0.insert(r.kernel.id);
                    if r.verdict.class == ExactnessClass::BitExact {
                        c.1.insert(r.kernel.id);
                        if let Some(sp) = &r.speed {
                            c.2 = Some(c.2.unwrap_or(0.0).max(sp.gbps));
                        }
                    }
                }
                let glance: Vec<_> = s
                    .glance(f)
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|c| {
                        (
                            (c.op, c.semantics, c.dtype),
                            (c.kernels, c.bit_exact, c.best_bit_exact_gbps),
                        )
                    })
                    .collect();
                let want: Vec<_> = cells
                    .into_iter()
                    .map(|(k, (a, b, g))| (k, (a.len() as i64, b.len() as i64, g)))
                    .collect();
                assert_eq!(glance, want, "{ctx} glance");

                let (unverified, utotal) = s.unverified_page(f, 1000, 0).await.unwrap();
                let got: Vec<_> = unverified
                    .iter()
                    .map(|u| (u.kernel.name.clone(), u.only_on.clone(), u.no_dtype_ran))
                    .collect();
                assert_eq!(got, slow_unverified, "{ctx} awaiting");
                assert_eq!(utotal as usize, slow_unverified.len(), "{ctx} awaiting");
            }
        }
    }
}

/// `verify-request --stale`'s list by index equals the old per-kernel walk: newest verdict on
/// the arch read in full, stale by suite or driver, or verified only elsewhere.
async fn stale_list_matches(s: &Store) {
    for arch in [SM90, SM80, SM100] {
        let driver = s.newest_driver(arch).await.unwrap();
        for suite in ["1", "2"] {
            let mut slow = vec![];
            for k in all_kernels(
                s,
                KernelQuery {
                    arch: Some(arch),
                    ..Default::default()
                },
            )
            .await
            {
                let all = s.verifications_for_kernel(&k.digest).await.unwrap();
                match newest_slow(s, &k, Some(arch)).await {
                    Some(v) => {
                        let r = &v.report;
                        if r.suite_version != suite
                            || driver
                                .as_deref()
                                .is_some_and(|d| d != r.device.driver_version)
                            || r.audit().is_some_and(|a| !a.audited)
                        {
                            slow.push((
                                k.id,
                                Some((
                                    r.suite_version.clone(),
                                    r.device.driver_version.clone(),
                                    r.audit().is_some_and(|a| !a.audited),
                                )),
                            ));
                        }
                    }
                    None if !all.is_empty() => slow.push((k.id, None)),
                    None => {}
                }
            }
            let q = KernelQuery {
                limit: 1000,
                ..Default::default()
            };
            let (fast, total) = s
                .stale_on(arch, &q, suite, driver.as_deref())
                .await
                .unwrap();
            let fast: Vec<_> = fast.into_iter().map(|(k, v)| (k.id, v)).collect();
            assert_eq!(fast, slow, "{arch} suite {suite}");
            assert_eq!(total as usize, slow.len());
        }
    }
}

async fn index_answers_like_the_reports(s: Store) {
    s.migrate().await.unwrap();
    fixture(&s).await;
    let g = s.answer_generation().await.unwrap();
    assert!(
        g > 24,
        "each stored kernel and verification moves the generation: {g}"
    );
    resolve_candidates_match(&s).await;
    policy_list_matches(&s).await;
    matrix_matches(&s).await;
    assert_eq!(
        s.answer_generation().await.unwrap(),
        g,
        "reads do not move it"
    );
}

/// The verdict index in memory (`Store::verdict_index`) answers every read a resolve and the
/// policy list make of it as the reports do.
async fn verdict_index_matches_the_reports(s: &Store) {
    resolve_candidates_match(s).await;
    policy_list_matches(s).await;
}

/// The index built a write at a time (caught up after every kernel and verification stored)
/// and the index read whole by another store on the same database answer alike, and as the
/// reports do.
async fn verdict_index_answers_like_the_reports(s: Store, url: &str) {
    let g = s.answer_generation().await.unwrap();
    s.verdict_index(g).await.unwrap(); // loaded empty
    fixture_with(&s, true).await;
    verdict_index_matches_the_reports(&s).await;
    let fresh = Store::connect(url).await.unwrap();
    verdict_index_matches_the_reports(&fresh).await;
    // A write after the load is read by the next catch-up, on either store.
    let b = bundle(24);
    let toml = b
        .manifest_toml
        .replacen("name = \"k00\"", "name = \"a_first\"", 1);
    let k = KernelBundle::from_parts(&toml, &b.source).unwrap();
    s.insert_kernel(&k, "submitted", "tests").await.unwrap();
    s.seed_verification(
        &k.digest(),
        &report(&k, SM90, 3, 1234.0),
        Some(&cert("key-c", 99)),
    )
    .await
    .unwrap();
    verdict_index_matches_the_reports(&fresh).await;
    verdict_index_matches_the_reports(&s).await;
}

/// A database from before migration 0008: its verifications get their newest rows, verdicts,
/// speeds and facts on upgrade, and answer as the reports do.
async fn upgrade_backfills(s: Store) {
    s.migrate_to(7).await.unwrap();
    let mut n = 0;
    for i in 0..9 {
        let k = bundle(i);
        s.insert_kernel(&k, "submitted", "tests").await.unwrap();
        for v in 0..(1 + i % 3) {
            n += 1;
            let arch = if v == 2 { SM80 } else { SM90 };
            let r = report(&k, arch, i + v, 900.0 + (i * 13 % 7) as f64);
            let c = (i % 2 == 0).then(|| cert(if v == 0 { "key-a" } else { "key-b" }, n));
            let json = |x: &str| x.replace('\'', "''");
            s.execute_raw(&format!(
                "INSERT INTO verifications (kernel_digest, job_id, arch, device_name, \
                 exactness_class, max_ulp, max_mismatch_fraction, max_abs_diff, deterministic, \
                 batch_invariant, integrity_ok, report_json, created_at, certificate, driver_version) \
                 VALUES ('{}', NULL, '{arch}', 'test', '{}', 0, 0, 0, 1, 1, 1, '{}', '2026-01-0{}T00:00:00Z', {}, '{}')",
                k.digest(),
                r.summary.overall.class,
                json(&serde_json::to_string(&r).unwrap()),
                1 + v,
                c.map(|c| format!("'{}'", json(&serde_json::to_string(&c).unwrap())))
                    .unwrap_or_else(|| "NULL".into()),
                r.device.driver_version,
            ))
            .await
            .unwrap();
        }
    }
    s.migrate().await.unwrap();
    assert_eq!(
        s.scalar_raw("SELECT COUNT(*) FROM verification_facts")
            .await
            .unwrap(),
        n as i64
    );
    assert_eq!(s.backfill_summaries().await.unwrap(), 0, "filled once");
    resolve_candidates_match(&s).await;
    policy_list_matches(&s).await;
    matrix_matches(&s).await;
    stale_list_matches(&s).await;
}

/// Stores not migrated: the upgrade tests start from an older schema, the others migrate first.
async fn sqlite() -> (Store, kernel_store::testing::TempSqlite) {
    let db = kernel_store::testing::fresh_sqlite();
    (Store::connect(&db.url).await.unwrap(), db)
}

async fn postgres() -> Option<Store> {
    let url = kernel_store::testing::fresh_postgres_url("newest-verdict test").await?;
    Some(Store::connect(&url).await.unwrap())
}

kernel_store::both_backends!(
    index_answers_like_the_reports,
    upgrade_backfills,
    upgrade_fills_measured_times,
    an_unaudited_verdict_is_stale,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verdict_index_answers_like_the_reports_on_sqlite() {
    let db = kernel_store::testing::fresh_sqlite();
    let s = Store::open(&db.url).await.unwrap();
    verdict_index_answers_like_the_reports(s, &db.url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verdict_index_answers_like_the_reports_on_postgres() {
    if let Some(url) = kernel_store::testing::fresh_postgres_url("verdict index test").await {
        let s = Store::open(&url).await.unwrap();
        verdict_index_answers_like_the_reports(s, &url).await;
    }
}

/// A database from before migration 0015, its verifications stored as release 14 wrote them
/// (with their facts and verdicts, no measured time): the upgrade fills each one's measured
/// time from its report's `started_at` and its import time (no job: imported), so that the
/// matrix and the field say when the GPU measured, as the verification rows do; the facts stay
/// immutable.
async fn upgrade_fills_measured_times(s: Store) {
    s.migrate_to(14).await.unwrap();
    let json = |x: &str| x.replace('\'', "''");
    // Kernel name -> (verification id, measured, imported).
    let mut want: BTreeMap<String, (i64, String, Option<String>)> = BTreeMap::new();
    for i in 0..3 {
        let k = bundle(i);
        s.insert_kernel(&k, "submitted", "tests").await.unwrap();
        let r = report(&k, SM90, 12 * i, 1000.0); // bit-exact, measured in December 2025
        let job = if i == 1 {
            "41".to_string()
        } else {
            "NULL".into()
        };
        let stored = format!("2026-02-0{}T12:00:00Z", 1 + i);
        s.execute_raw(&format!(
            "INSERT INTO verifications (kernel_digest, job_id, arch, device_name, \
             exactness_class, max_ulp, max_mismatch_fraction, max_abs_diff, deterministic, \
             batch_invariant, integrity_ok, report_json, created_at, certificate, driver_version) \
             VALUES ('{}', {job}, 'sm_90', 'test', '{}', 0, 0, 0, 1, 1, 1, '{}', '{stored}', NULL, '{}')",
            k.digest(),
            r.summary.overall.class,
            json(&serde_json::to_string(&r).unwrap()),
            r.device.driver_version,
        ))
        .await
        .unwrap();
        let id = s
            .scalar_raw("SELECT MAX(id) FROM verifications")
            .await
            .unwrap();
        s.execute_raw(&format!(
            "INSERT INTO verification_facts (verification_id, kernel_digest, arch, class, \
             suite_version, driver_version, cert_key, requested_cols, device_name, created_at) \
             VALUES ({id}, '{}', 'sm_90', '{}', '{}', '{}', NULL, '', 'test', '{stored}')",
            k.digest(),
            r.summary.overall.class,
            r.suite_version,
            r.device.driver_version,
        ))
        .await
        .unwrap();
        for (dtype, v) in &r.summary.per_dtype {
            s.execute_raw(&format!(
                "INSERT INTO verification_verdicts (verification_id, dtype, class, class_rank, \
                 class_ulp, cases_run, integrity_ok, mismatches, nonfinite_parity, deterministic, \
                 batch_invariant, within_tolerance, max_ulp, max_abs_diff, max_mismatch_fraction, \
                 models, argmax_failures, verdict_json, models_json) \
                 VALUES ({id}, '{dtype}', '{}', 0, 0, {}, 1, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, '{}', '[]')",
                v.class,
                v.cases_run,
                json(&serde_json::to_string(v).unwrap()),
            ))
            .await
            .unwrap();
        }
        let imported = (i != 1).then(|| stored.clone());
        assert!(r.started_at < stored, "measured before it was stored");
        want.insert(
            k.manifest.name.clone(),
            (id, r.started_at.clone(), imported),
        );
    }
    s.migrate().await.unwrap();
    assert_eq!(
        s.backfill_summaries().await.unwrap(),
        0,
        "its facts were there"
    );
    let f = MatrixFilter {
        op: None,
        dtype: None,
        arch: None,
    };
    let (matrix, _) = s.matrix_page(f, 100, 0).await.unwrap();
    let (field, _) = s.field_page(f, 100, 0).await.unwrap();
    assert!(!matrix.is_empty() && matrix.len() == field.len());
    for (m, fr) in matrix.iter().zip(&field) {
        let (_, measured, imported) = &want[&m.kernel.name];
        assert_eq!((&m.verified_at, &m.imported_at), (measured, imported));
        let (_, measured, imported) = &want[&fr.kernel.name];
        assert_eq!((&fr.verified_at, &fr.imported_at), (measured, imported));
    }
    let mut before = 0;
    for (id, measured, imported) in want.values() {
        let v = s.verification(*id).await.unwrap().unwrap();
        assert_eq!((&v.verified_at, &v.imported_at), (measured, imported));
        // Migration 0016: a CUDA report with no audit (made before it; the fixture's first,
        // `capabilities_for(0)`) is stored as unaudited, refused by every policy; the rows of
        // reports that carry an audit are not touched (this fixture left their columns empty).
        let unaudited = v.report.capabilities.is_none();
        before += unaudited as usize;
        let count = |cond: &str| {
            format!("SELECT COUNT(*) FROM verification_verdicts WHERE verification_id = {id} AND {cond}")
        };
        let dtypes = v.report.summary.per_dtype.len() as i64;
        assert_eq!(
            s.scalar_raw(&count(
                "capabilities = ',!unaudited,' AND capabilities_json IS NOT NULL"
            ))
            .await
            .unwrap(),
            if unaudited { dtypes } else { 0 }
        );
        assert_eq!(
            s.scalar_raw(&count("capabilities IS NULL")).await.unwrap(),
            if unaudited { 0 } else { dtypes }
        );
    }
    assert_eq!(
        before, 1,
        "the fixture has one report from before the audit"
    );
    assert!(
        s.execute_raw("UPDATE verification_facts SET verified_at = 'now'")
            .await
            .is_err(),
        "the facts stay immutable"
    );
}

/// Migration 0016 stores, for each CUDA verification made before the capability audit, the
/// flags and the audit `VerificationReport::audit` gives it (`CapabilityReport::before_audit`):
/// the rows it backfills and the rows written since say the same, on both backends.
#[test]
fn the_before_audit_migration_stores_what_the_report_gives() {
    let want = CapabilityReport::before_audit();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for backend in ["sqlite", "postgres"] {
        let path = root.join(format!("migrations/{backend}/0016_before_audit.sql"));
        let sql = std::fs::read_to_string(&path).unwrap();
        let json = sql
            .split("capabilities_json = '")
            .nth(1)
            .and_then(|t| t.split('\'').next())
            .unwrap_or_else(|| panic!("{}: no capabilities_json literal", path.display()));
        let got: CapabilityReport = serde_json::from_str(json).unwrap();
        assert_eq!(got, want, "{}", path.display());
        assert!(
            sql.contains(&format!("capabilities = '{}'", want.flags().unwrap())),
            "{}",
            path.display()
        );
    }
}

/// A kernel whose newest verdict on an architecture was not audited (made before the
/// capability audit) is stale there even when its suite and driver are the newest: every
/// policy refuses it until a new verification audits it, which `verify-request --stale` queues.
async fn an_unaudited_verdict_is_stale(s: Store) {
    s.migrate().await.unwrap();
    let suite = "7";
    let mut ids = vec![];
    for (i, audit) in [(0usize, false), (1, true)] {
        let k = bundle(i);
        s.insert_kernel(&k, "submitted", "tests").await.unwrap();
        let mut r = report(&k, SM90, 1, 1000.0);
        r.suite_version = suite.into();
        r.capabilities = if audit { capabilities_for(1) } else { None };
        assert_eq!(r.audit().map(|a| a.audited), Some(audit));
        s.seed_verification(&k.digest(), &r, None).await.unwrap();
        ids.push((
            s.kernel_by_digest(&k.digest()).await.unwrap().unwrap().id,
            audit,
        ));
    }
    let driver = s.newest_driver(SM90).await.unwrap();
    let q = KernelQuery {
        limit: 100,
        ..Default::default()
    };
    let (stale, total) = s
        .stale_on(SM90, &q, suite, driver.as_deref())
        .await
        .unwrap();
    let stale: Vec<(i64, bool)> = stale
        .iter()
        .map(|(k, v)| (k.id, v.as_ref().unwrap().2))
        .collect();
    let want: Vec<(i64, bool)> = ids
        .iter()
        .filter(|(_, a)| !a)
        .map(|(id, _)| (*id, true))
        .collect();
    assert_eq!(stale, want);
    assert_eq!(total, 1);
}
