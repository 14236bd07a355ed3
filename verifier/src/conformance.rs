//! Conformance of the built-in reference layers with real PyTorch eager: reads the inputs and
//! eager outputs that `scripts/conformance.py` wrote (safetensors + manifest.json), runs the
//! reference on the same inputs on this GPU, and tabulates the bitwise agreement.

use crate::cases::{CaseInputs, HostTensor};
use crate::gpu::CudaExecutor;
use crate::numeric::compare;
use anyhow::{bail, Context};
use kernel_registry::report::{percent, ULP_INFINITE};
use kernel_registry::{DType, Op, Semantics};
use safetensors::SafeTensors;
use serde::Deserialize;
use std::path::Path;

/// One comparison written by conformance.py.
#[derive(Debug, Deserialize)]
pub struct Entry {
    /// What eager ran, e.g. "HF LlamaRMSNorm".
    pub layer: String,
    pub op: Op,
    pub semantics: Semantics,
    pub dtype: DType,
    pub rows: u64,
    pub cols: u64,
    pub dist: String,
    /// The safetensors file (relative to the folder) holding x (a gated op: gate and up),
    /// [weight], [bias], [residual], out, [residual_out].
    pub file: String,
}

#[derive(Debug, Deserialize)]
pub struct Manifest {
    pub torch_version: String,
    pub device: String,
    pub date: String,
    #[serde(default)]
    pub cuda: String,
    pub entries: Vec<Entry>,
}

fn tensor(st: &SafeTensors, name: &'static str, dt: DType) -> anyhow::Result<HostTensor> {
    let t = st.tensor(name).with_context(|| format!("tensor {name}"))?;
    Ok(HostTensor {
        name,
        dtype: dt,
        bytes: t.data().to_vec(),
    })
}

fn opt(st: &SafeTensors, name: &'static str, dt: DType) -> Option<HostTensor> {
    tensor(st, name, dt).ok()
}

/// Run the comparison and return a markdown table.
pub fn run(dir: &Path) -> anyhow::Result<String> {
    let mtext = std::fs::read_to_string(dir.join("manifest.json"))
        .with_context(|| format!("reading {}/manifest.json", dir.display()))?;
    let man: Manifest = serde_json::from_str(&mtext).context("manifest.json")?;
    let mut exec = CudaExecutor::new();
    let dev = exec.gpu().map_err(|e| anyhow::anyhow!("{e}"))?.info.clone();
    let mut rows_md = Vec::new();
    for e in &man.entries {
        let bytes = std::fs::read(dir.join(&e.file)).with_context(|| e.file.clone())?;
        let st = SafeTensors::deserialize(&bytes).with_context(|| e.file.clone())?;
        let inp = CaseInputs {
            mean: None,
            rstd: None,
            x: tensor(&st, if e.op.is_gated() { "gate" } else { "x" }, e.dtype)?,
            up: opt(&st, "up", e.dtype),
            residual: opt(&st, "residual", e.dtype),
            weight: opt(&st, "weight", e.dtype),
            bias: opt(&st, "bias", e.dtype),
            dy: None,
        };
        let eager = tensor(&st, "out", e.dtype)?;
        let eager_res = opt(&st, "residual_out", e.dtype);
        let (ours, ours_res) = exec
            .run_reference(e.op, e.semantics, e.dtype, e.rows, e.cols, &inp)
            .map_err(|err| anyhow::anyhow!("{}: {err}", e.file))?;
        if ours.len() != eager.bytes.len() {
            bail!(
                "{}: eager output has {} bytes, reference {}",
                e.file,
                eager.bytes.len(),
                ours.len()
            );
        }
        let mut pairs: Vec<(&[u8], &[u8])> = vec![(&ours, &eager.bytes)];
        if let (Some(a), Some(b)) = (&ours_res, &eager_res) {
            pairs.push((a, &b.bytes));
        }
        let x = compare(e.dtype, &pairs);
        let ulp = if x.max_ulp == ULP_INFINITE {
            "inf".to_string()
        } else {
            x.max_ulp.to_string()
        };
        rows_md.push(format!(
            "| {} | {}/{} | {} | {}x{} | {} | {} / {} | {} | {} | {:.2e} | {} |",
            e.layer,
            e.op,
            e.semantics,
            e.dtype,
            e.rows,
            e.cols,
            e.dist,
            x.mismatches,
            x.elements,
            percent(x.mismatch_fraction),
            ulp,
            x.max_abs_diff,
            if x.nonfinite_parity { "yes" } else { "NO" }
        ));
    }
    let mut s = String::new();
    s.push_str(&format!(
        "Device: {} ({}), driver {}, CUDA {}; torch {} ({}); date {}.\n\n",
        dev.name,
        dev.arch,
        dev.driver_version,
        dev.cuda_version,
        man.torch_version,
        man.cuda,
        man.date
    ));
    s.push_str("| eager layer | reference | dtype | shape | inputs | mismatched / elements | fraction | max ulp | max abs | NaN/Inf parity |\n");
    s.push_str("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for r in rows_md {
        s.push_str(&r);
        s.push('\n');
    }
    Ok(s)
}
