//! `kernelize verify`, `kernelize device`, the hidden `kernelize __sandbox` (the isolated child
//! that runs untrusted kernels) and `kernelize __conformance` (built-in references against
//! PyTorch eager outputs).

use anyhow::Context as _;
use kernel_registry::report::{
    coverage, percent, CaseStatus, ShapeRequest, VerificationReport, ULP_INFINITE,
};
use kernel_registry::{DType, KernelBundle, Policy};
use std::process::ExitCode;
use std::time::Duration;
use verifier::indicatif::{ProgressBar, ProgressStyle};
use verifier::{Limits, VerifyOptions};

/// Verify a kernel folder on this machine's GPU.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Widths: a hub hands a kernel out only at a row length it was verified at. \
The suite covers the row lengths of popular models and random ones; verify the widths your model \
uses too:
  kernelize verify kernels/rms_norm_llama --cols 11008                  (rows 1..64)
  kernelize verify kernels/rms_norm_llama --cols 11008 --cols 13824 --rows 1..512
  kernelize verify kernels/rms_norm_llama --shape 11008:1..64 --shape 4096x8192
Each requested shape runs in every verified dtype, besides the suite; the run fails when a \
requested shape has no case that ran. Elementwise ops (silu, gelu, gelu_tanh) count as covered \
up to the largest element count (rows x cols) verified."
)]
pub struct VerifyArgs {
    /// The kernel's folder (holding kernel.toml and its .cu source).
    pub path: std::path::PathBuf,
    /// Exit non-zero unless the report meets this policy for every verified dtype
    /// (e.g. `bit_exact`, `ulp:2,deterministic`, `tolerance`).
    #[arg(long, value_parser = one_report_policy)]
    pub policy: Option<Policy>,
    /// Only this dtype (bf16, f16, f32); repeat for several. Default: every entry.
    #[arg(long = "dtype")]
    pub dtypes: Vec<DType>,
    /// The smaller suite (fewer shapes and distributions).
    #[arg(long)]
    pub quick: bool,
    /// Replay a run: the seed printed by an earlier run.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Write the full VerificationReport as JSON here.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Also verify at row length N (repeatable), at the row counts of --rows.
    #[arg(long = "cols", value_name = "N")]
    pub cols: Vec<u64>,
    /// Row counts for every --cols: `A..B` (inclusive, 1 <= A <= B) or one count `N`.
    /// Default 1..64 (decode batches).
    #[arg(long, value_name = "A..B")]
    pub rows: Option<String>,
    /// A shape to verify besides the suite (repeatable): `COLS` (rows 1..64), `COLS:A..B`, or
    /// `COLSxROWS` (one row count), e.g. `--shape 11008:1..64`.
    #[arg(long = "shape", value_name = "COLS[:A..B]")]
    pub shape: Vec<String>,
    /// Time limit of one kernel launch, seconds.
    #[arg(long, default_value_t = 5.0)]
    pub launch_limit_s: f64,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub candidates: PythonCandidateArgs,
}

/// How a Python candidate (docs/spec.md section 2b) is run: its child process and what it may import.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct PythonCandidateArgs {
    /// Folders of Python packages a Python candidate may import, put first on its `sys.path`
    /// (e.g. made with `pip install --no-deps --target DIR liger_kernel-0.8.5-py3-none-any.whl`).
    /// Repeatable. The interpreter is --python's.
    #[arg(long = "candidate-packages", value_name = "DIR")]
    pub packages: Vec<std::path::PathBuf>,
    /// Time limit of one case of a Python candidate (first import, Triton or Inductor
    /// compilation, every call), seconds; the child is killed past it.
    #[arg(long, default_value_t = 300)]
    pub candidate_case_limit_s: u64,
    /// Host memory (RLIMIT_DATA) of a Python candidate's child, GiB; 0: no limit.
    #[arg(long, default_value_t = 32)]
    pub candidate_memory_gib: u64,
    /// Refuse to run a Python candidate unless its child has a network namespace of its own.
    #[arg(long)]
    pub require_network_isolation: bool,
}

impl PythonCandidateArgs {
    pub fn options(&self, python: &str) -> verifier::python::PythonOptions {
        verifier::python::PythonOptions {
            python: python.into(),
            package_dirs: self
                .packages
                .iter()
                .map(|p| std::path::absolute(p).unwrap_or_else(|_| p.clone()))
                .collect(),
            memory_limit_bytes: (self.candidate_memory_gib > 0)
                .then_some(self.candidate_memory_gib << 30),
            case_limit: std::time::Duration::from_secs(self.candidate_case_limit_s),
            require_network_isolation: self.require_network_isolation,
            ..Default::default()
        }
    }
}

/// Model-level verification (argmax agreement): the candidate substituted for every matching
/// layer of real small models, run through PyTorch.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ModelArgs {
    /// Also measure the kernel inside these models: a Hugging Face model folder (config.json +
    /// model.safetensors), or a folder of them such as the shipped `models`. Repeatable. Needs a
    /// Python with torch (CUDA) and transformers.
    #[arg(long = "model", value_name = "DIR")]
    pub models: Vec<std::path::PathBuf>,
    /// The evaluation text run through each model (default: eval.txt beside the model folders,
    /// e.g. models/eval.txt).
    #[arg(long, value_name = "FILE")]
    pub eval_text: Option<std::path::PathBuf>,
    /// Python interpreter with torch and transformers for the model-level harness.
    #[arg(long, env = "KERNELIZE_PYTHON", default_value = "python3")]
    pub python: String,
    /// Folder holding the `kernelize_verifier` (the model-level harness) and `kernelize` Python
    /// packages (default: `KERNELIZE_PYTHONPATH`, else a `python/` folder found from the current
    /// directory or the executable's).
    #[arg(long, value_name = "DIR")]
    pub python_path: Option<std::path::PathBuf>,
    /// Tokens of the evaluation text to run.
    #[arg(long, default_value_t = 512)]
    pub max_tokens: u32,
    /// Time limit of the whole model-level run, seconds.
    #[arg(long, default_value_t = 600)]
    pub model_timeout_s: u64,
}

impl ModelArgs {
    /// `options`, with a Python candidate's package folders and confinement from `candidates`
    /// (the model-level run of a Python candidate runs its code too).
    pub fn options_with(
        &self,
        candidates: &PythonCandidateArgs,
    ) -> anyhow::Result<Option<verifier::model::ModelOptions>> {
        Ok(self.options()?.map(|mut m| {
            m.python_candidate = candidates.options(&self.python);
            m
        }))
    }

    /// `None` when no model was asked for; an error says what is missing and how to fix it.
    pub fn options(&self) -> anyhow::Result<Option<verifier::model::ModelOptions>> {
        if self.models.is_empty() {
            return Ok(None);
        }
        let mut models = Vec::new();
        for m in &self.models {
            models.extend(
                verifier::model::model_dirs(m).map_err(|e| anyhow::anyhow!("--model: {e}"))?,
            );
        }
        let text = match &self.eval_text {
            Some(t) => t.clone(),
            None => {
                let first = &self.models[0];
                let base = if first.join("config.json").is_file() {
                    first.parent().map(|p| p.to_path_buf()).unwrap_or_default()
                } else {
                    first.clone()
                };
                base.join("eval.txt")
            }
        };
        if !text.is_file() {
            anyhow::bail!(
                "evaluation text {} not found: give one with --eval-text FILE",
                text.display()
            );
        }
        let python_path = match &self.python_path {
            Some(p) => p.clone(),
            None => verifier::model::find_python_path().ok_or_else(|| {
                anyhow::anyhow!(
                    "the verifier's Python programs (python/kernelize_verifier/model_level.py, \
                     beside the kernelize package) were not found from here; give their folder \
                     (python/) with --python-path DIR or KERNELIZE_PYTHONPATH"
                )
            })?,
        };
        Ok(Some(verifier::model::ModelOptions {
            models,
            text,
            python: self.python.clone(),
            python_path,
            max_tokens: self.max_tokens,
            timeout: Duration::from_secs(self.model_timeout_s),
            python_candidate: Default::default(),
        }))
    }
}

/// Print the GPU, driver, CUDA and measured copy bandwidth.
#[derive(clap::Args, Debug)]
pub struct DeviceArgs {}

/// Internal: the isolated child process that runs untrusted kernels.
#[derive(clap::Args, Debug)]
pub struct SandboxArgs {}

/// Internal: compare the built-in references with PyTorch eager outputs written by
/// scripts/conformance.py, and write a markdown table.
#[derive(clap::Args, Debug)]
pub struct ConformanceArgs {
    /// Folder with the safetensors files and manifest.json written by conformance.py.
    pub dir: std::path::PathBuf,
    /// Write the markdown table here (default: print it).
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
}

fn ulp_str(u: u64) -> String {
    if u == ULP_INFINITE {
        "inf".into()
    } else {
        u.to_string()
    }
}

/// The readable table printed at the end of a verification.
pub fn render_report(r: &VerificationReport) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "{} {} ({}/{})  digest {}\n{} ({}), driver {}, CUDA {}, copy {:.0} GB/s\nseed {}  suite {}  {:.1} s\n\n",
        r.kernel.name,
        r.kernel.version,
        r.kernel.op,
        r.kernel.semantics,
        r.kernel.digest,
        r.device.name,
        r.device.arch,
        r.device.driver_version,
        r.device.cuda_version,
        r.device.copy_gbps,
        r.seed,
        r.suite_version,
        r.duration_s
    ));
    s.push_str(&format!(
        "{:<32} {:>10} {:>9} {:>6} {:>9} {:>6} {:>6} {:>10} {:>7}  note\n",
        "case", "status", "mismatch", "ulp", "max_abs", "det", "batch", "GB/s", "x ref"
    ));
    for c in &r.cases {
        let status = match c.status {
            CaseStatus::Ran if !c.integrity_failures.is_empty() => "INTEGRITY",
            CaseStatus::Ran => "ran",
            CaseStatus::NotApplicable => "n/a",
            CaseStatus::Error => "ERROR",
        };
        let (mism, ulp, abs) = match &c.exactness {
            Some(e) => (
                percent(e.mismatch_fraction),
                ulp_str(e.max_ulp),
                format!("{:.2e}", e.max_abs_diff),
            ),
            None => ("-".into(), "-".into(), "-".into()),
        };
        let yn = |b: Option<bool>| match b {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "-",
        };
        let (gbps, sp) = match &c.speed {
            Some(sp) => (
                format!("{:.0} ({:.0}%)", sp.gbps, sp.copy_fraction * 100.0),
                format!("{:.2}", sp.speedup),
            ),
            None => ("-".into(), "-".into()),
        };
        let mut note = c.integrity_failures.join("; ");
        if let Some(n) = &c.note {
            if !note.is_empty() {
                note.push_str("; ");
            }
            note.push_str(n);
        }
        let note: String = note
            .lines()
            .next()
            .unwrap_or("")
            .chars()
            .take(140)
            .collect();
        s.push_str(&format!(
            "{:<32} {:>10} {:>9} {:>6} {:>9} {:>6} {:>6} {:>10} {:>7}  {}\n",
            c.id,
            status,
            mism,
            ulp,
            abs,
            yn(c.deterministic),
            yn(c.batch_invariant),
            gbps,
            sp,
            note
        ));
    }
    s.push('\n');
    for (dt, v) in &r.summary.per_dtype {
        s.push_str(&format!(
            "{dt:<5} {:<12} ran {:>3}, n/a {:>3}, errors {:>3}; deterministic {}, batch invariant {}, integrity {}; {}\n",
            v.class.to_string(),
            v.cases_run,
            v.cases_not_applicable,
            v.cases_error,
            v.deterministic,
            v.batch_invariant,
            if v.integrity_ok { "ok" } else { "FAILS" },
            v.describe()
        ));
        if !v.per_gradient.is_empty() {
            // a backward op: each gradient's class (docs/spec.md section 2c)
            let each: Vec<String> = v
                .per_gradient
                .iter()
                .map(|(g, c)| format!("{g} {c}"))
                .collect();
            s.push_str(&format!("      per gradient: {}\n", each.join(", ")));
        }
        if let Some(g) = v.gbps_4096x8192 {
            s.push_str(&format!(
                "      4096x8192: {g:.0} GB/s ({:.0}% of copy), {:.2}x the reference\n",
                v.copy_fraction_4096x8192.unwrap_or(0.0) * 100.0,
                v.speedup_4096x8192.unwrap_or(0.0)
            ));
        }
        if let Some(g) = v.gbps_32768x4096 {
            s.push_str(&format!(
                "      32768x4096: {g:.0} GB/s ({:.0}% of copy)\n",
                v.copy_fraction_32768x4096.unwrap_or(0.0) * 100.0
            ));
        }
    }
    if !r.model.is_empty() || !r.model_notes.is_empty() {
        s.push_str("\nmodel level (candidate in every matching layer vs eager):\n");
        s.push_str(&format!(
            "{:<14} {:>5} {:>6} {:>7} {:>12} {:>8} {:>8} {:>10} {:>8}\n",
            "model",
            "dtype",
            "tokens",
            "layers",
            "max_logit",
            "argmax",
            "top5",
            "mean_kl",
            "top1_p"
        ));
        for m in &r.model {
            s.push_str(&format!(
                "{:<14} {:>5} {:>6} {:>7} {:>12.3e} {:>8} {:>8} {:>10.2e} {:>8}\n",
                m.model_name,
                m.dtype.as_str(),
                m.tokens,
                m.layers_replaced,
                m.max_logit_abs_diff,
                percent(m.argmax_match_fraction),
                percent(m.top5_overlap),
                m.mean_kl,
                m.eager_mean_top1_prob
                    .map(|p| format!("{p:.3}"))
                    .unwrap_or_else(|| "-".into())
            ));
        }
        for n in &r.model_notes {
            s.push_str(&format!("  {n}\n"));
        }
    }
    s.push_str(&render_audit(r.capabilities.as_ref()));
    s.push_str(&format!(
        "overall: {}  (replay: --seed {})\n",
        r.summary.overall.class, r.seed
    ));
    s
}

/// The capability audit's lines of the text report (docs/spec.md section 3b): what the compiled
/// code can do, whether the manifest declares it, and what a policy must allow.
fn render_audit(audit: Option<&kernel_registry::capability::CapabilityReport>) -> String {
    let Some(a) = audit else {
        return "capabilities: not audited (no compiled code was audited for this report; a \
                policy with `audited` refuses it)\n"
            .into();
    };
    let mut s = String::new();
    if a.found.is_empty() {
        s.push_str(&format!(
            "capabilities: {}; the compiled code does none of the audited things\n",
            if a.audited {
                "audited"
            } else {
                "partly audited"
            }
        ));
    } else {
        s.push_str(&format!(
            "capabilities: {}; the compiled code:\n",
            if a.audited {
                "audited"
            } else {
                "partly audited"
            }
        ));
        for f in &a.found {
            let dts: Vec<&str> = f.dtypes.iter().map(|d| d.as_str()).collect();
            let standing = if !f.name.needs_declaration() {
                "needs no declaration"
            } else if a.is_declared(f.name) {
                "declared"
            } else {
                "NOT DECLARED: every policy refuses it"
            };
            let gate = if f.name.gated() {
                format!("; handed out only to a policy with allow:{}", f.name)
            } else {
                String::new()
            };
            s.push_str(&format!(
                "  {:<20} {} ({}; {}): {}{gate}\n",
                f.name.as_str(),
                f.name.describe(),
                dts.join(", "),
                standing,
                f.evidence.join(", ")
            ));
        }
    }
    for n in &a.notes {
        s.push_str(&format!("  {n}\n"));
    }
    s
}

/// The shapes asked for with --cols/--rows and --shape, checked, de-duplicated, in order.
pub fn requested_shapes(
    cols: &[u64],
    rows: Option<&str>,
    shapes: &[String],
) -> Result<Vec<ShapeRequest>, String> {
    let (rows_min, rows_max) = match rows {
        None => (1, 64),
        Some(_) if cols.is_empty() => {
            return Err(
                "--rows applies to the widths given with --cols: add --cols N (or use --shape COLS:A..B)"
                    .into(),
            )
        }
        Some(r) => {
            let num = |t: &str| {
                t.trim().parse::<u64>().map_err(|_| {
                    format!("--rows {r}: `{t}` is not a whole number; write A..B (e.g. 1..64) or N")
                })
            };
            match r.split_once("..") {
                Some((a, b)) => (num(a)?, num(b.trim_start_matches('='))?),
                None => {
                    let n = num(r)?;
                    (n, n)
                }
            }
        }
    };
    let mut out: Vec<ShapeRequest> = Vec::new();
    for &c in cols {
        let s = ShapeRequest::new(c, rows_min, rows_max).map_err(|e| format!("--cols {c}: {e}"))?;
        if !out.contains(&s) {
            out.push(s);
        }
    }
    for t in shapes {
        let s: ShapeRequest = t.parse().map_err(|e| {
            format!("--shape {t}: {e} (forms: COLS, COLS:A..B, COLSxROWS; e.g. 11008:1..64)")
        })?;
        if !out.contains(&s) {
            out.push(s);
        }
    }
    Ok(out)
}

/// For each requested shape and dtype that ran, whether a case ran at that width; lines for
/// the report and the requested shapes nothing ran at.
fn requested_coverage(report: &VerificationReport) -> (Vec<String>, Vec<String>) {
    let cov = coverage(report);
    let mut lines = Vec::new();
    let mut missing = Vec::new();
    for s in &report.requested_shapes {
        for dt in report.summary.per_dtype.keys() {
            match cov.iter().find(|c| c.dtype == *dt && c.cols == s.cols) {
                Some(c) => lines.push(format!(
                    "  {s} {dt}: covered, {} row count(s) in {}..{}",
                    c.row_counts.len(),
                    c.rows_min,
                    c.rows_max
                )),
                None => missing.push(format!(
                    "requested shape {s}: no {dt} case ran at cols {} (the verifier did not run it, or its cases errored)",
                    s.cols
                )),
            }
        }
    }
    (lines, missing)
}

/// A policy one report can meet: `confirmed:N` counts certificates of several workers on a
/// hub, which a single run cannot show.
pub fn one_report_policy(s: &str) -> Result<Policy, String> {
    let p: Policy = s
        .parse()
        .map_err(|e: kernel_registry::policy::PolicyError| e.to_string())?;
    if p.confirmations > 0 {
        return Err(format!(
            "`confirmed:{}` counts the certificates of several workers on a hub, which one run cannot show: drop it here, and ask a hub with it (`GET /v1/resolve?...&policy={p}`)",
            p.confirmations
        ));
    }
    Ok(p)
}

pub fn verify(args: VerifyArgs) -> anyhow::Result<ExitCode> {
    let shapes = requested_shapes(&args.cols, args.rows.as_deref(), &args.shape)
        .map_err(anyhow::Error::msg)?;
    let bundle = KernelBundle::load_dir(&args.path)
        .with_context(|| format!("loading the kernel in {}", args.path.display()))?;
    // Checked before the GPU work so that a typo does not cost a whole run.
    let model_opts = args.model.options_with(&args.candidates)?;
    let opts = VerifyOptions {
        dtypes: (!args.dtypes.is_empty()).then(|| args.dtypes.clone()),
        quick: args.quick,
        seed: args.seed,
        limits: Limits {
            launch_s: args.launch_limit_s,
            ..Limits::default()
        },
        sandbox_exe: None,
        shapes: shapes.clone(),
        python: Some(args.candidates.options(&args.model.python)),
    };
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    let report = verifier::verify_bundle(&bundle, &opts, &mut |p| {
        bar.set_length(p.total as u64);
        bar.set_position(p.done as u64);
        match &p.outcome {
            None => bar.set_message(p.case_id.clone()),
            Some(o) if o.starts_with("ERROR") || o.starts_with("INTEGRITY") => {
                let line: String = o.lines().next().unwrap_or("").chars().take(160).collect();
                bar.println(format!("{}: {line}", p.case_id));
            }
            Some(_) => {}
        }
    });
    bar.finish_and_clear();
    let mut report = report?;
    if report.requested_shapes.is_empty() {
        report.requested_shapes = shapes;
    }
    let mut failing = Vec::new();
    if let Some(mo) = &model_opts {
        eprintln!(
            "cases done in {:.1} s; model-level run on {} model(s)",
            report.duration_s,
            mo.models.len()
        );
        if let Err(e) = verifier::model::attach(&mut report, &bundle, mo, &mut |l| eprintln!("{l}"))
        {
            failing.push(e.to_string());
        }
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    print!("{}", render_report(&report));
    let (covered, missing) = requested_coverage(&report);
    if !report.requested_shapes.is_empty() {
        println!("requested shapes:");
        for l in &covered {
            println!("{l}");
        }
    }
    failing.extend(missing);

    let overall = &report.summary.overall;
    if overall.cases_run == 0 {
        failing
            .push("rejected: no case ran (every case errored or was not applicable)".to_string());
    }
    if !overall.integrity_ok {
        for c in &report.cases {
            if c.status == CaseStatus::Error || !c.integrity_failures.is_empty() {
                let why = c
                    .integrity_failures
                    .first()
                    .cloned()
                    .or_else(|| c.note.clone())
                    .unwrap_or_default();
                failing.push(format!(
                    "{}: {}",
                    c.id,
                    why.lines()
                        .next()
                        .unwrap_or("")
                        .chars()
                        .take(200)
                        .collect::<String>()
                ));
            }
        }
    }
    if let Some(policy) = &args.policy {
        for dt in report.summary.per_dtype.keys() {
            if let Err(why) = policy.evaluate(&report, *dt) {
                failing.push(format!("{dt}: fails policy {policy}: {}", why.join("; ")));
            }
        }
    }
    if failing.is_empty() {
        if let Some(p) = &args.policy {
            println!("policy {p}: met");
        }
        Ok(ExitCode::SUCCESS)
    } else {
        println!("\nFAILED:");
        for f in &failing {
            println!("  {f}");
        }
        Ok(ExitCode::FAILURE)
    }
}

pub fn device(_args: DeviceArgs) -> anyhow::Result<ExitCode> {
    if !verifier::gpu_available() {
        anyhow::bail!(
            "no CUDA GPU here: the CUDA driver (libcuda.so.1) did not load or reports no device"
        );
    }
    let d = verifier::device_info()?;
    println!("GPU        {} ({}, {} SMs)", d.name, d.arch, d.sm_count);
    println!("driver     {}", d.driver_version);
    println!(
        "CUDA       {} (driver API), NVRTC {}",
        d.cuda_version,
        verifier::nvrtc_version()
    );
    println!("NVRTC -I   {}", verifier::cuda::cuda_include_dir());
    println!(
        "copy       {:.0} GB/s device-to-device (read + write, measured now)",
        d.copy_gbps
    );
    Ok(ExitCode::SUCCESS)
}

pub fn sandbox(_args: SandboxArgs) -> anyhow::Result<ExitCode> {
    verifier::sandbox::serve()?;
    Ok(ExitCode::SUCCESS)
}

pub fn conformance(args: ConformanceArgs) -> anyhow::Result<ExitCode> {
    let table = verifier::conformance::run(&args.dir)?;
    match &args.out {
        Some(p) => std::fs::write(p, &table).with_context(|| format!("writing {}", p.display()))?,
        None => print!("{table}"),
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernel_registry::report::{tests_support, ExactnessClass};

    /// A backward kernel's report says each gradient's class under its dtype's line; a forward
    /// kernel's has no such line.
    #[test]
    fn the_text_report_names_each_gradients_class() {
        let mut r = tests_support::report_with(0, 0);
        assert!(!render_report(&r).contains("per gradient"));
        let v = r
            .summary
            .per_dtype
            .get_mut(&kernel_registry::DType::Bf16)
            .unwrap();
        v.per_gradient = [
            ("dw".to_string(), ExactnessClass::MaxUlp(1)),
            ("dx".to_string(), ExactnessClass::BitExact),
        ]
        .into_iter()
        .collect();
        let text = render_report(&r);
        assert!(
            text.contains("      per gradient: dw ulp:1, dx bit_exact\n"),
            "{text}"
        );
    }

    /// The text report says what the audit found, whether each is declared and which policies
    /// take it; a report without an audit says so.
    #[test]
    fn the_text_report_shows_the_capability_audit() {
        use kernel_registry::capability::{
            Audit, Capability, CapabilityReport, DeclaredCapability,
        };
        use kernel_registry::DType;
        let mut r = tests_support::report_with(0, 0);
        r.capabilities = None;
        assert!(render_report(&r).contains("capabilities: not audited"));
        let mut a = Audit::default();
        a.found
            .entry(Capability::Trap)
            .or_default()
            .insert("trap".into());
        a.found
            .entry(Capability::Clock)
            .or_default()
            .insert("%globaltimer".into());
        let declared = [DeclaredCapability {
            name: Capability::Trap,
            reason: "bounds check".into(),
        }];
        r.capabilities = Some(CapabilityReport::of_modules(
            &[(DType::Bf16, Ok(a))],
            &declared,
        ));
        let text = render_report(&r);
        assert!(
            text.contains("capabilities: audited; the compiled code:\n"),
            "{text}"
        );
        assert!(
            text.contains("  clock                reads a clock (bf16; NOT DECLARED: every policy refuses it): %globaltimer; handed out only to a policy with allow:clock\n"),
            "{text}"
        );
        assert!(
            text.contains("  trap                 traps (bf16; declared): trap\n"),
            "{text}"
        );
        r.capabilities = Some(CapabilityReport::of_modules(
            &[(DType::Bf16, Ok(Audit::default()))],
            &[],
        ));
        assert!(render_report(&r).contains("the compiled code does none of the audited things"));
    }
}
