//! Real GPU reports pass; each forgery is refused with its own field and message.

use super::*;
use crate::report::{ModelReport, ShapeRequest, VerificationReport};
use crate::Arch;

/// A full verification of the bundled rms_norm_llama on an H200 (suite 2026.3, bf16/f16/f32,
/// 295 cases with the large-index case), by `kernelize verify --json` in the GPU run of
/// 2026-11-23 (docs/gpu-runs/2026-11-23-hardening).
const H200_FULL: &str = include_str!(
    "../../../../docs/gpu-runs/2026-11-23-hardening/reports/full-kernel-rms_norm_llama.json"
);
const RMS_NORM_LLAMA: &str = include_str!("../../../../kernels/rms_norm_llama/kernel.toml");

/// Reports recorded on the H200 by earlier suites (tests/fixtures/reports/README.md), with the
/// manifest of the kernel each verified.
const RECORDED: &[(&str, &str)] = &[
    (
        include_str!("../../../../tests/fixtures/reports/recorded/rms_norm_llama.json"),
        include_str!("../../../../kernels/rms_norm_llama/kernel.toml"),
    ),
    (
        include_str!("../../../../tests/fixtures/reports/recorded/rms_norm_llama_wbr.json"),
        include_str!("../../../../kernels/rms_norm_llama_wbr/kernel.toml"),
    ),
    (
        include_str!("../../../../tests/fixtures/reports/recorded/silu_and_mul.json"),
        include_str!("../../../../kernels/silu_and_mul/kernel.toml"),
    ),
    (
        include_str!("../../../../tests/fixtures/reports/recorded/silu_and_mul_fused.json"),
        include_str!("../../../../kernels/silu_and_mul_fused/kernel.toml"),
    ),
    (
        include_str!("../../../../tests/fixtures/reports/recorded/silu_fastmath.json"),
        include_str!("../../../../kernels/silu_fastmath/kernel.toml"),
    ),
    (
        include_str!("../../../../tests/fixtures/reports/recorded/with_model/silu.json"),
        include_str!("../../../../kernels/silu/kernel.toml"),
    ),
];

fn honest() -> VerificationReport {
    serde_json::from_str(H200_FULL).expect("the recorded report parses")
}

/// A bundled kernel's manifest as the recorded reports verified it: at version 1.0.0 (the
/// bundled manifests have since moved to 1.0.1 with one source for the bundled kernels; op,
/// semantics and dtypes are unchanged, and the digest is taken from the report).
fn manifest(toml: &str) -> Manifest {
    let mut m = Manifest::parse(toml).expect("bundled manifest");
    m.version = semver::Version::new(1, 0, 0);
    m
}

fn check_with(r: &VerificationReport, m: &Manifest, shapes: &[ShapeRequest]) -> Vec<ReportError> {
    let digest = honest().kernel.digest;
    let want = Expected {
        digest: &digest,
        manifest: m,
        shapes,
        suites: KNOWN_SUITES,
        suite_cases: None,
    };
    validate(r, &want).err().unwrap_or_default()
}

fn check(r: &VerificationReport) -> Vec<ReportError> {
    check_with(r, &manifest(RMS_NORM_LLAMA), &[])
}

/// The index of the first case that ran at `rows x cols` in `dtype` with a speed measured.
fn timed(r: &VerificationReport) -> usize {
    r.cases
        .iter()
        .position(|c| c.speed.is_some() && c.id == "bf16/4096x8192/normal")
        .expect("the headline case is timed")
}

fn first_ran(r: &VerificationReport) -> usize {
    r.cases
        .iter()
        .position(|c| c.status == CaseStatus::Ran && !c.id.ends_with("large_index"))
        .unwrap()
}

#[test]
fn a_real_h200_report_is_accepted_and_its_summary_rederives_unchanged() {
    let r = honest();
    assert_eq!(r.cases.len(), 295);
    assert_eq!(check(&r), vec![], "a real GPU report must pass");
    let mut again = r.clone();
    let differ = rederive(&mut again);
    assert_eq!(
        differ,
        Vec::<String>::new(),
        "the summary the GPU run wrote"
    );
    assert_eq!(again.summary.overall.class, r.summary.overall.class);
}

#[test]
fn reports_of_earlier_suites_recorded_on_the_h200_are_accepted() {
    for (json, toml) in RECORDED {
        let r: VerificationReport = serde_json::from_str(json).unwrap();
        let m = manifest(toml);
        let want = Expected {
            digest: &r.kernel.digest,
            manifest: &m,
            shapes: &[],
            suites: KNOWN_SUITES,
            suite_cases: None,
        };
        assert_eq!(
            validate(&r, &want).err().unwrap_or_default(),
            vec![],
            "{} ({})",
            r.kernel.name,
            r.suite_version
        );
        let mut again = r.clone();
        assert_eq!(
            rederive(&mut again),
            Vec::<String>::new(),
            "{}",
            r.kernel.name
        );
    }
}

type Forgery = (
    &'static str,
    fn(&mut VerificationReport),
    &'static str,
    &'static str,
);

/// Each forgery: a name, the change, the field the refusal names and a phrase of its message.
fn forgeries() -> Vec<Forgery> {
    vec![
        (
            "schema",
            |r| r.schema_version = 2,
            "schema_version",
            "is not 1",
        ),
        (
            "another kernel's digest",
            |r| r.kernel.digest = Digest::of_bytes(b"other"),
            "kernel.digest",
            "but the job verifies",
        ),
        (
            "another op",
            |r| r.kernel.op = crate::Op::Silu,
            "kernel.op",
            "the report is for `silu`",
        ),
        (
            "unknown suite",
            |r| r.suite_version = "2099.1".into(),
            "suite_version",
            "not accepted by this hub",
        ),
        (
            "made-up verifier version",
            |r| r.verifier_version = "trust-me".into(),
            "verifier_version",
            "is not a version",
        ),
        (
            "H200 on sm_80",
            |r| r.device.arch = Arch::new(8, 0),
            "device.arch",
            "an H200 is sm_90, not sm_80",
        ),
        (
            "copy bandwidth above the H200's peak",
            |r| r.device.copy_gbps = 9000.0,
            "device.copy_gbps",
            "above the 4800 GB/s peak DRAM bandwidth of an H200",
        ),
        (
            "unknown device faster than any of its arch",
            |r| {
                r.device.name = "Mystery Accelerator".into();
                r.device.copy_gbps = 6000.0;
            },
            "device.copy_gbps",
            "any known sm_90 device",
        ),
        (
            "no copy bandwidth",
            |r| r.device.copy_gbps = 0.0,
            "device.copy_gbps",
            "a finite bandwidth above 0",
        ),
        (
            "no SMs",
            |r| r.device.sm_count = 0,
            "device.sm_count",
            "at least 1",
        ),
        ("no cases", |r| r.cases.clear(), "cases", "without cases"),
        (
            "a case twice",
            |r| {
                let c = r.cases[0].clone();
                r.cases.push(c);
            },
            "cases[295].id",
            "appears twice",
        ),
        (
            "shape changed under its id",
            |r| r.cases[0].cols = 4096,
            "cases[0].id",
            "does not name the case's own fields",
        ),
        (
            "a case the kernel cannot have run",
            |r| {
                r.cases[0].status = CaseStatus::NotApplicable;
                r.cases[0].exactness = None;
                r.cases[0].accuracy = None;
            },
            "cases[0].status",
            "marked not_applicable, but the kernel's declared constraints",
        ),
        (
            "ran without exactness",
            |r| r.cases[0].exactness = None,
            "cases[0].exactness",
            "carries no exactness",
        ),
        (
            "elements of another shape",
            |r| {
                let i = first_ran(r);
                let e = r.cases[i].exactness.as_mut().unwrap();
                e.elements *= 2;
                e.ulp_histogram[0] *= 2;
            },
            "exactness.elements",
            "but its shape has",
        ),
        (
            "more mismatches than elements",
            |r| {
                let i = first_ran(r);
                let e = r.cases[i].exactness.as_mut().unwrap();
                e.mismatches = e.elements + 1;
            },
            "exactness.mismatches",
            "no more elements can differ",
        ),
        (
            "mismatch fraction not mismatches / elements",
            |r| {
                let i = first_ran(r);
                r.cases[i].exactness.as_mut().unwrap().mismatch_fraction = 0.25;
            },
            "exactness.mismatch_fraction",
            "mismatches / elements",
        ),
        (
            "negative abs diff",
            |r| {
                let i = first_ran(r);
                r.cases[i].exactness.as_mut().unwrap().max_abs_diff = -1.0;
            },
            "exactness.max_abs_diff",
            "a finite difference, at least 0",
        ),
        (
            "NaN accuracy",
            |r| {
                let i = first_ran(r);
                r.cases[i].accuracy.as_mut().unwrap().candidate_rms = f64::NAN;
            },
            "accuracy.candidate_rms",
            "a finite error",
        ),
        (
            "an ulp distance without a mismatch",
            |r| {
                let i = first_ran(r);
                r.cases[i].exactness.as_mut().unwrap().max_ulp = 3;
            },
            "exactness.mismatches",
            "no element differs, yet a difference is reported",
        ),
        (
            "histogram of other elements",
            |r| {
                let i = first_ran(r);
                r.cases[i].exactness.as_mut().unwrap().ulp_histogram[0] -= 1;
            },
            "exactness.ulp_histogram",
            "the buckets hold",
        ),
        (
            "histogram farther than max_ulp",
            |r| {
                let i = first_ran(r);
                let e = r.cases[i].exactness.as_mut().unwrap();
                e.mismatches = 1;
                e.mismatch_fraction = 1.0 / e.elements as f64;
                e.max_ulp = 1;
                e.max_abs_diff = 0.01;
                e.ulp_histogram[0] -= 1;
                e.ulp_histogram[5] += 1;
            },
            "exactness.max_ulp",
            "farther than max_ulp 1",
        ),
        (
            "bytes moved halved",
            |r| {
                let i = timed(r);
                r.cases[i].speed.as_mut().unwrap().bytes_moved /= 2;
            },
            "speed.bytes_moved",
            "is not what the op must move",
        ),
        (
            "GB/s not bytes over time",
            |r| {
                let i = timed(r);
                r.cases[i].speed.as_mut().unwrap().gbps *= 2.0;
            },
            "speed.gbps",
            "bytes_moved / median_us / 1000",
        ),
        (
            "copy fraction not GB/s over copy bandwidth",
            |r| {
                let i = timed(r);
                r.cases[i].speed.as_mut().unwrap().copy_fraction = 0.99;
            },
            "speed.copy_fraction",
            "gbps / device.copy_gbps",
        ),
        (
            "speedup not reference time over time",
            |r| {
                let i = timed(r);
                r.cases[i].speed.as_mut().unwrap().speedup = 10.0;
            },
            "speed.speedup",
            "reference_median_us / median_us",
        ),
        (
            "a consistent speed above the roofline",
            |r| {
                let copy = r.device.copy_gbps;
                let i = timed(r);
                let s = r.cases[i].speed.as_mut().unwrap();
                s.median_us /= 5.0;
                s.gbps = gbps_of(s.bytes_moved, s.median_us);
                s.copy_fraction = s.gbps / copy;
                s.speedup = s.reference_median_us / s.median_us;
            },
            "speed.gbps",
            "above the roofline of the device the report names",
        ),
        (
            "a zero time",
            |r| {
                let i = timed(r);
                r.cases[i].speed.as_mut().unwrap().median_us = 0.0;
            },
            "speed.median_us",
            "a finite time above 0 us",
        ),
        (
            "compiled for another arch",
            |r| r.compiled[0].options[0] = "--gpu-architecture=sm_80".into(),
            "compiled[0].options",
            "compiled with `--gpu-architecture=sm_80` on a sm_90 device",
        ),
        (
            "a code hash that is not one",
            |r| r.compiled[0].code_sha256 = "abc".into(),
            "compiled[0].code_sha256",
            "is not a SHA-256",
        ),
        (
            "argmax above 1",
            |r| {
                r.model.push(model());
                r.model[0].argmax_match_fraction = 1.5;
            },
            "model[0].argmax_match_fraction",
            "a fraction in [0, 1]",
        ),
        (
            "argmax not a whole number of tokens",
            |r| {
                r.model.push(model());
                r.model[0].argmax_match_fraction = 0.5 + 1e-3 / 512.0;
            },
            "model[0].argmax_match_fraction",
            "is not a whole number of 512 tokens",
        ),
        (
            "a model with no layer replaced",
            |r| {
                r.model.push(model());
                r.model[0].layers_replaced = 0;
            },
            "model[0].layers_replaced",
            "no layer of tiny-llama was replaced",
        ),
    ]
}

fn model() -> ModelReport {
    ModelReport {
        model_name: "tiny-llama".into(),
        model_digest: "sha256:0".into(),
        dtype: DType::Bf16,
        tokens: 512,
        layers_replaced: 4,
        max_logit_abs_diff: 0.0,
        argmax_match_fraction: 1.0,
        top5_overlap: 1.0,
        mean_kl: 0.0,
        eager_mean_top1_prob: Some(0.99),
        adaptation: None,
    }
}

#[test]
fn each_forgery_is_refused_with_its_own_message() {
    let mut messages = BTreeSet::new();
    for (name, forge, field, says) in forgeries() {
        let mut r = honest();
        forge(&mut r);
        let errors = check(&r);
        let hit = errors
            .iter()
            .find(|e| e.field.ends_with(field) && e.to_string().contains(says));
        let Some(hit) = hit else {
            panic!("{name}: no error on `{field}` saying `{says}`; got {errors:#?}");
        };
        assert!(
            messages.insert(hit.to_string()),
            "{name}: the same message as another forgery: {hit}"
        );
    }
}

#[test]
fn forgeries_against_the_job_are_refused() {
    // A dtype the kernel has no entry for.
    let bf16_f16 = RMS_NORM_LLAMA.replace("f32 = \"rms_norm_llama_f32\"\n", "");
    let errors = check_with(&honest(), &manifest(&bf16_f16), &[]);
    assert!(
        errors
            .iter()
            .any(|e| e.field.ends_with(".dtype") && e.to_string().contains("no f32 entry")),
        "{errors:#?}"
    );
    // A case the kernel's constraints exclude, marked ran.
    let narrow = format!("{RMS_NORM_LLAMA}\n[constraints]\ncols_max = 8192\n");
    let errors = check_with(&honest(), &manifest(&narrow), &[]);
    assert!(
        errors.iter().any(|e| e.field.ends_with(".status")
            && e.to_string().contains("cols 16384 > cols_max 8192")),
        "{errors:#?}"
    );
    // The job asked for a width the report did not run.
    let shape: ShapeRequest = "11008:1..64".parse().unwrap();
    let errors = check_with(&honest(), &manifest(RMS_NORM_LLAMA), &[shape]);
    assert_eq!(errors[0].field, "requested_shapes", "{errors:#?}");
    assert!(errors[0]
        .to_string()
        .contains("the job asked for [11008:1..64]"));
}

#[test]
fn the_large_index_case_may_be_not_applicable_for_want_of_memory() {
    // What the verifier writes on a device with too little free memory.
    let mut r = honest();
    let c = r.cases.last_mut().unwrap();
    assert!(c.id.ends_with("/large_index"));
    c.status = CaseStatus::NotApplicable;
    c.note = Some("not run: needs 25.8 GB of device memory, 20.1 GB free".into());
    (c.exactness, c.accuracy, c.deterministic) = (None, None, None);
    assert_eq!(check(&r), vec![]);
}

#[test]
fn a_speed_above_the_roofline_recorded_as_an_integrity_failure_is_evidence() {
    // What the verifier writes for a kernel that skips work: the speed and the failure.
    let mut r = honest();
    let copy = r.device.copy_gbps;
    let i = timed(&r);
    let c = &mut r.cases[i];
    let s = c.speed.as_mut().unwrap();
    s.median_us /= 5.0;
    s.gbps = gbps_of(s.bytes_moved, s.median_us);
    s.copy_fraction = s.gbps / copy;
    s.speedup = s.reference_median_us / s.median_us;
    let why = s.above_roofline().unwrap();
    c.integrity_failures.push(why);
    assert_eq!(check(&r), vec![]);
    rederive(&mut r);
    assert_eq!(
        r.summary.overall.class,
        crate::report::ExactnessClass::Fails
    );
}

#[test]
fn the_suite_case_list_is_checked_when_the_hub_can_draw_it() {
    let r = honest();
    let planned: Vec<PlannedCase> = r
        .cases
        .iter()
        .map(|c| PlannedCase {
            id: c.id.clone(),
            dtype: c.dtype,
            rows: c.rows,
            cols: c.cols,
            distribution: c.distribution.clone(),
            eps: c.eps,
        })
        .collect();
    let m = manifest(RMS_NORM_LLAMA);
    let want = |planned| Expected {
        digest: &r.kernel.digest,
        manifest: &m,
        shapes: &[],
        suites: KNOWN_SUITES,
        suite_cases: Some(planned),
    };
    assert_eq!(validate(&r, &want(&planned)), Ok(()));
    // A case dropped (a failing one, say) is missing.
    let mut dropped = r.clone();
    dropped.cases.remove(10);
    let e = validate(&dropped, &want(&planned)).unwrap_err();
    assert!(
        e[0].to_string().contains(
            "1 of the 295 cases suite 2026.3 draws for seed 1549776688970102797 are missing"
        ),
        "{e:#?}"
    );
    // A case of the forger's choosing is not the suite's.
    let mut extra = r.clone();
    let mut c = extra.cases[0].clone();
    c.id = "bf16/2x64/normal".into();
    c.rows = 2;
    let e = c.exactness.as_mut().unwrap();
    e.elements = 128;
    e.ulp_histogram[0] = 128;
    extra.cases.push(c);
    let e = validate(&extra, &want(&planned)).unwrap_err();
    assert!(
        e[0].to_string().contains("is not a case of suite 2026.3"),
        "{e:#?}"
    );
    // An eps the suite did not draw.
    let mut eps = r.clone();
    eps.cases[0].eps = Some(0.5);
    let e = validate(&eps, &want(&planned)).unwrap_err();
    assert_eq!(e[0].field, "cases[0].eps", "{e:#?}");
}

#[test]
fn rederive_replaces_a_flattering_summary() {
    let mut r = honest();
    let i = first_ran(&r);
    let e = r.cases[i].exactness.as_mut().unwrap();
    e.mismatches = 1;
    e.mismatch_fraction = 0.9; // not what 1 / elements is; rederive writes its own
    e.max_ulp = 1;
    e.max_abs_diff = 0.01;
    e.ulp_histogram[0] -= 1;
    e.ulp_histogram[1] += 1;
    // The posted summary still says bit_exact.
    let differ = rederive(&mut r);
    assert_eq!(
        r.summary.overall.class,
        crate::report::ExactnessClass::MaxUlp(1)
    );
    assert!(
        differ.contains(&"summary.overall.class".to_string()),
        "{differ:?}"
    );
    assert!(
        differ.contains(&"summary.per_dtype.bf16.mismatches".to_string()),
        "{differ:?}"
    );
    let e = r.cases[i].exactness.as_ref().unwrap();
    assert_eq!(e.mismatch_fraction, 1.0 / e.elements as f64);
}

/// A capability audit fits the kernel: declarations as the manifest's, the kernel's dtypes,
/// bounded text; an honest one passes, each forgery names its field.
#[test]
fn a_capability_audit_must_fit_the_kernel() {
    use crate::capability::{audit_ptx, CapabilityReport, DeclaredCapability};
    let ptx =
        ".version 8.5\n.target sm_90\n.address_size 64\n.visible .entry k()\n{\ntrap;\nret;\n}\n";
    let mut m = manifest(RMS_NORM_LLAMA);
    m.capabilities = vec![DeclaredCapability {
        name: crate::capability::Capability::Trap,
        reason: "bad launch shapes".into(),
    }];
    let audit = |m: &Manifest| {
        CapabilityReport::of_modules(
            &m.dtypes()
                .into_iter()
                .map(|d| (d, Ok(audit_ptx(ptx))))
                .collect::<Vec<_>>(),
            &m.capabilities,
        )
    };
    let mut r = honest();
    r.capabilities = Some(audit(&m));
    assert_eq!(check_with(&r, &m, &[]), vec![]);
    let fields = |r: &VerificationReport| -> Vec<String> {
        check_with(r, &m, &[])
            .into_iter()
            .map(|e| e.field)
            .collect()
    };
    // Declarations other than the manifest's.
    let mut f = r.clone();
    f.capabilities.as_mut().unwrap().declared.clear();
    assert_eq!(fields(&f), vec!["capabilities.declared"]);
    let e = check_with(&f, &m, &[])[0].to_string();
    assert!(e.contains("declares [], the manifest [trap]"), "{e}");
    // A dtype the kernel lacks; no evidence; a long one; audited with a note.
    let mut f = r.clone();
    f.capabilities.as_mut().unwrap().found[0].dtypes = vec![];
    assert_eq!(fields(&f), vec!["capabilities.found[0].dtypes"]);
    let mut f = r.clone();
    f.capabilities.as_mut().unwrap().found[0].evidence = vec![];
    assert_eq!(fields(&f), vec!["capabilities.found[0].evidence"]);
    let mut f = r.clone();
    f.capabilities.as_mut().unwrap().found[0].evidence = vec!["x".repeat(MAX_AUDIT_TEXT + 1)];
    assert_eq!(fields(&f), vec!["capabilities.found[0].evidence"]);
    let mut f = r.clone();
    f.capabilities.as_mut().unwrap().notes = vec!["bf16: not audited".into()];
    assert_eq!(fields(&f), vec!["capabilities.audited"]);
    let mut f = r.clone();
    let dup = f.capabilities.as_ref().unwrap().found[0].clone();
    f.capabilities.as_mut().unwrap().found.push(dup);
    assert_eq!(fields(&f), vec!["capabilities.found"]);
    // An older report (no audit) still fits.
    let mut old = r.clone();
    old.capabilities = None;
    assert_eq!(check_with(&old, &m, &[]), vec![]);
}

const BACKWARD: &str = r#"
name = "rms_norm_llama_backward"
version = "1.0.0"
op = "rms_norm_backward"
description = "d"
authors = ["a"]
license = "MIT"
source = "k.cu"
[entry.bf16]
dx = "dx_bf16"
dwp = "dwp_bf16"
dw = "dw_bf16"
[entry.f16]
dx = "dx_f16"
dwp = "dwp_f16"
dw = "dw_f16"
[entry.f32]
dx = "dx_f32"
dwp = "dwp_f32"
dw = "dw_f32"
"#;

/// `n` elements compared, none differing.
fn exact(n: u64) -> Exactness {
    Exactness::all_equal(n)
}

/// `e` with one of its elements one ulp off (max abs and relative diff 1e-3).
fn one_ulp_off(e: &mut Exactness) {
    e.mismatches = 1;
    e.mismatch_fraction = 1.0 / e.elements as f64;
    e.max_ulp = 1;
    e.max_abs_diff = 1e-3;
    e.max_rel_diff = 1e-3;
    e.ulp_histogram[0] -= 1;
    e.ulp_histogram[1] += 1;
}

/// The recorded report's cases as a bit-exact verification of a backward kernel (docs/spec.md
/// section 2c): each case with its two gradients and their combination.
fn backward_report() -> (VerificationReport, Manifest) {
    let m = Manifest::parse(BACKWARD).unwrap();
    let mut r = honest();
    r.kernel.op = m.op;
    r.kernel.name = m.name.clone();
    r.compiled.clear();
    r.model.clear();
    r.cases.retain(|c| !is_large_index(c));
    for c in r.cases.iter_mut().filter(|c| c.status == CaseStatus::Ran) {
        let (dx, dw) = (c.rows * c.cols, c.cols);
        c.gradients = [("dx", dx), ("dw", dw)]
            .into_iter()
            .map(|(k, n)| {
                (
                    k.to_string(),
                    crate::report::GradientReport {
                        exactness: exact(n),
                        accuracy: None,
                    },
                )
            })
            .collect();
        c.exactness = Some(exact(dx + dw));
        c.accuracy = None;
        c.speed = None; // timed for the forward's bytes
    }
    r.summary = Summary::from_cases(&r.cases);
    (r, m)
}

/// A backward kernel's report: every case states each gradient's exactness and their
/// combination; the summary has a class per gradient. A case missing a gradient, a gradient's
/// element count that is not its shape's, a combination that is not its gradients', or a
/// forward case with gradients is refused.
#[test]
fn a_backward_report_states_each_gradient() {
    let (r, m) = backward_report();
    assert_eq!(check_with(&r, &m, &[]), vec![]);
    assert_eq!(
        r.summary
            .overall
            .per_gradient
            .values()
            .map(|c| c.to_string())
            .collect::<Vec<_>>(),
        ["bit_exact", "bit_exact"]
    );
    let i = r
        .cases
        .iter()
        .position(|c| c.status == CaseStatus::Ran && c.rows > 1)
        .unwrap();
    let refused = |r: &VerificationReport, m: &Manifest, needle: &str| {
        let got = check_with(r, m, &[]);
        assert!(
            got.iter().any(|e| e.to_string().contains(needle)),
            "{needle}: {got:?}"
        );
    };
    // a gradient missing
    let mut bad = r.clone();
    bad.cases[i].gradients.remove("dw");
    refused(&bad, &m, "the gradients reported are [dx]");
    // dw counted as a whole matrix
    let mut bad = r.clone();
    let c = &mut bad.cases[i];
    c.gradients.get_mut("dw").unwrap().exactness = exact(c.rows * c.cols);
    refused(&bad, &m, "cols (one row)");
    // a combination that hides a gradient's mismatches
    let mut bad = r.clone();
    let c = &mut bad.cases[i];
    one_ulp_off(&mut c.gradients.get_mut("dw").unwrap().exactness);
    refused(&bad, &m, "is not its gradients'");
    // gradients on a forward op's case
    let mut fwd = honest();
    let j = fwd
        .cases
        .iter()
        .position(|c| c.status == CaseStatus::Ran)
        .unwrap();
    fwd.cases[j].gradients = r.cases[i].gradients.clone();
    refused(&fwd, &manifest(RMS_NORM_LLAMA), "has no gradients");
}

/// The summary classes each gradient by the one rule: a dw that differs by one ulp makes dw
/// `ulp:1` and the combination `ulp:1`, while dx stays `bit_exact`.
#[test]
fn each_gradient_has_its_own_class() {
    let (mut r, _) = backward_report();
    let i = r
        .cases
        .iter()
        .position(|c| c.status == CaseStatus::Ran)
        .unwrap();
    let c = &mut r.cases[i];
    for e in [
        &mut c.gradients.get_mut("dw").unwrap().exactness,
        c.exactness.as_mut().unwrap(),
    ] {
        one_ulp_off(e);
    }
    let s = Summary::from_cases(&r.cases);
    let classes: Vec<String> = s
        .overall
        .per_gradient
        .iter()
        .map(|(k, c)| format!("{k} {c}"))
        .collect();
    assert_eq!(classes, ["dw ulp:1", "dx bit_exact"]);
    assert_eq!(s.overall.class.to_string(), "ulp:1");
}
