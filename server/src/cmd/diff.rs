//! `kernelize diff`: the divergence locator (python/kernelize/locate.py, docs/compile.md) run
//! with a Python that has torch; every argument after `diff` is the locator's own.

use std::process::{Command, ExitCode};

use anyhow::Context;

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
    /// The Python to run (needs torch; transformers for --model).
    #[arg(long, env = "KERNELIZE_PYTHON", default_value = "python3")]
    pub python: String,
    /// The folder holding the `kernelize` Python package (default: found from here or beside
    /// the executable, or KERNELIZE_PYTHONPATH).
    #[arg(long)]
    pub python_path: Option<std::path::PathBuf>,
    /// The locator's arguments (after `--`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub args: Vec<String>,
}

pub fn run(a: DiffArgs) -> anyhow::Result<ExitCode> {
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
        .arg("kernelize.locate")
        .args(&a.args)
        .env("PYTHONPATH", &path)
        .status()
        .with_context(|| format!("starting {} (set --python or KERNELIZE_PYTHON)", a.python))?;
    Ok(match status.code() {
        Some(c) => ExitCode::from(u8::try_from(c).unwrap_or(2)),
        None => ExitCode::from(2),
    })
}
