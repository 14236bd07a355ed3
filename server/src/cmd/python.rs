//! The subcommands that are the Python client's programs, run with a Python that has torch:
//! `kernelize diff` (the divergence locator, python/kernelize/locate.py, docs/compile.md) and
//! `kernelize lock` (a project's lock file, python/kernelize/project.py, docs/python.md). Every
//! argument after `--` is the program's own.

use std::process::{Command, ExitCode};

use anyhow::Context;

/// Which Python runs the program, and where the `kernelize` package is.
#[derive(clap::Args, Debug)]
pub struct PythonArgs {
    /// The Python to run (needs torch, and transformers for models).
    #[arg(long, env = "KERNELIZE_PYTHON", default_value = "python3")]
    pub python: String,
    /// The folder holding the `kernelize` Python package (default: found from here or beside
    /// the executable, or KERNELIZE_PYTHONPATH).
    #[arg(long)]
    pub python_path: Option<std::path::PathBuf>,
    /// The program's arguments (after `--`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub args: Vec<String>,
}

#[derive(clap::Args, Debug)]
#[command(
    about = "Name the first module and op where torch.compile (or kernelize's kernels) departs \
             from eager on a model, and the rewrite responsible",
    long_about = "Name the first module and op where a candidate (plain torch.compile, kernelize's \
                  exact compile, the model kernelized, or another torch.compile backend) departs \
                  from eager on a model, with the bits, max abs diff and ulp, and the inductor \
                  rewrite responsible. Runs `python3 -m kernelize.locate`; `kernelize diff -- \
                  --help` lists its options. Exit 0: identical; 1: a divergence was found.\n\n\
                  Examples:\n  kernelize diff -- --seed-model linear_layer_norm --dtype f32\n  \
                  kernelize diff -- --model models/tiny-llama --candidate inductor"
)]
pub struct DiffArgs {
    #[command(flatten)]
    pub py: PythonArgs,
}

#[derive(clap::Args, Debug)]
#[command(
    about = "Write one lock file for every model of a project, from its pyproject.toml",
    long_about = "Write one lock file for every model a project names in the [tool.kernelize] \
                  table of its pyproject.toml (hub, models, dtypes, arch, policy, lock, \
                  trusted_keys): each model's replaceable layers resolved against the hub and \
                  pinned by digest with the kernels' source, for \
                  kernelize.kernelize(model, lock=PATH) offline. Runs `python3 -m \
                  kernelize.project lock`; `kernelize lock -- --help` lists its options. Exit 0: \
                  written; 2: the project file or an option is wrong (the message says how).\n\n\
                  Examples:\n  kernelize lock\n  \
                  kernelize lock -- --project app/pyproject.toml --hub http://hub:8080 --arch sm_90"
)]
pub struct LockArgs {
    #[command(flatten)]
    pub py: PythonArgs,
}

pub fn diff(a: DiffArgs) -> anyhow::Result<ExitCode> {
    run_module("kernelize.locate", &[], a.py)
}

pub fn lock(a: LockArgs) -> anyhow::Result<ExitCode> {
    run_module("kernelize.project", &["lock"], a.py)
}

/// `python -m module first... args...` with the package on PYTHONPATH; its exit code.
fn run_module(module: &str, first: &[&str], a: PythonArgs) -> anyhow::Result<ExitCode> {
    let path = match a.python_path {
        Some(p) => p,
        None => verifier::model::find_python_path().ok_or_else(|| {
            anyhow::anyhow!(
                "the kernelize Python package was not found from here; give its folder with \
                 --python-path DIR or KERNELIZE_PYTHONPATH"
            )
        })?,
    };
    let status = Command::new(&a.python)
        .arg("-m")
        .arg(module)
        .args(first)
        .args(&a.args)
        .env("PYTHONPATH", &path)
        .status()
        .with_context(|| format!("starting {} (set --python or KERNELIZE_PYTHON)", a.python))?;
    Ok(match status.code() {
        Some(c) => ExitCode::from(u8::try_from(c).unwrap_or(2)),
        None => ExitCode::from(2),
    })
}
