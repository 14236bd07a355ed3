//! One case of a backward op (docs/spec.md section 2c; docs/backward.md, "What a verification
//! measures"). The candidate's entries run in [`Op::stages`] order on one stream with
//! `kernel_registry::backward`'s grids: three times with every gradient ([`Op::gradients`])
//! poisoned afresh (launch 2 on launch 1's poison inverted) and the workspace, where the op has
//! one, poisoned afresh, then once more with other grids for the entries that take any grid
//! (`kernel_registry::backward::any_grid`: the ABI promises they give the same bits). Then the
//! reference's entries (reference.cu, the same ABI) on buffers of their own. Measured per
//! gradient: its exactness against the reference and accuracy against the f64 oracle, and
//! their combination; determinism (repeated launches and the other grids); integrity (every
//! element of every gradient written, the guards of every buffer, inputs unchanged, a time
//! limit per launch); batch invariance where every gradient is `rows x cols`
//! (silu_mul_backward; rms_norm_backward's dw sums the rows); speed (the whole sequence, every
//! timed run's gradients checked on the GPU).
//!
//! The buffers of a call, by their ABI names ([`buffers`]): the gradients, the workspace
//! (`ws`), the inputs (rms_norm_backward: dx, dw, ws, dy, x, w; silu_mul_backward: d_gate,
//! d_up, dy, gate, up; layer_norm_backward: dx, dw, db, dy, x, mean, rstd, w; the activations'
//! backward ops: dx, dy, x). Address cases as the forward's (`address::plan` over them): a
//! deterministic kernel's call with its buffers at every placement, its gradients equal to
//! call 1's, inputs unchanged, guards intact.

use super::address::{self, Difference, Placement, PERIOD};
use super::batch;
use super::poison::{self, Poison};
use super::{determinism, integrity::unwritten_line, speed, CaseRun, Held, Kern, Tools};
use crate::abi::{reference_stage_symbol, stage_args, BackwardPtrs, Bufs};
use crate::cases::{self, CaseInputs, CaseSpec, HostTensor};
use crate::cuda::{Arg, DevBuf, Gpu, Launch, Reps};
use crate::exec::{ExecError, Limits};
use crate::gpu::BackwardReferenceOutputs;
use cudarc::driver::sys::CUfunction;
use kernel_registry::backward::{any_grid, stage_dims, workspace_bytes, DeviceShape};
use kernel_registry::manifest::{entry_options, LaunchDims};
use kernel_registry::report::{CaseReport, CaseStatus};
use kernel_registry::{KernelBundle, Op, Stage};
use std::sync::Arc;
use std::time::Duration;

/// A change of the grids of the entries that take any grid: (stage name, default grid) -> grid.
type Regrid<'a> = Option<&'a dyn Fn(&str, u32) -> u32>;

/// One call's gradients as downloaded, in [`Op::gradients`] order.
type Grads = Vec<Vec<u8>>;

/// The name of a backward op's workspace in its stages' parameters (`float* ws`).
const WORKSPACE: &str = "ws";

/// The candidate's and the reference's entries, on a device ready for them.
struct Loaded<'a> {
    gpu: &'a Gpu,
    cand: Vec<Entry>,
    refe: Vec<Entry>,
    tools: Tools,
}

/// One entry of a backward call, ready to launch.
struct Entry {
    stage: &'static Stage,
    name: String,
    f: CUfunction,
}

/// The buffers one call writes: its gradients (in [`Op::gradients`] order) and its workspace.
struct Outs {
    grads: Vec<DevBuf>,
    ws: Option<DevBuf>,
}

/// The buffers of a backward call of `op` by their ABI names, in the order the address cases
/// place them: the gradients ([`Op::gradients`] order), the workspace where a stage takes one,
/// then the inputs (the stages' other tensors, in order of first appearance).
pub(crate) fn buffers(op: Op) -> Vec<&'static str> {
    let mut v: Vec<&'static str> = op.gradients().iter().map(|g| g.name).collect();
    let tensors: Vec<&'static str> = op.stages().iter().flat_map(|s| s.tensors()).collect();
    if tensors.contains(&WORKSPACE) {
        v.push(WORKSPACE);
    }
    for t in tensors {
        if !v.contains(&t) {
            v.push(t);
        }
    }
    v
}

/// A backward call's input `name` (a tensor of its stages that is neither a gradient nor the
/// workspace): its host copy, `None` where the case drew none.
fn host_input<'a>(name: &str, inp: &'a CaseInputs) -> Option<&'a HostTensor> {
    match name {
        "dy" => inp.dy.as_ref(),
        // fused_add_rms_norm_backward's gradient of the residual output (drawn as `residual`)
        "dres" => inp.residual.as_ref(),
        "x" | "gate" => Some(&inp.x),
        "up" => inp.up.as_ref(),
        "w" => inp.weight.as_ref(),
        "mean" => inp.mean.as_ref(),
        "rstd" => inp.rstd.as_ref(),
        other => unreachable!("Op::stages names input `{other}`, unknown to the verifier"),
    }
}

/// The inputs a backward call uploads itself (the forward's [`Bufs`] hold the others).
const OWN_INPUTS: [&str; 4] = ["dy", "dres", "mean", "rstd"];

/// A backward call's input `name`: its host copy and its device buffer (`own`: those of
/// [`OWN_INPUTS`] the case has).
fn input<'a>(
    name: &str,
    inp: &'a CaseInputs,
    bufs: &'a Bufs,
    own: &'a [(&'static str, DevBuf)],
) -> (&'a HostTensor, &'a DevBuf) {
    let dev = match name {
        "x" | "gate" => Some(&bufs.x),
        "up" => bufs.up.as_ref(),
        "w" => bufs.weight.as_ref(),
        _ => own.iter().find(|(n, _)| *n == name).map(|(_, d)| d),
    };
    host_input(name, inp)
        .zip(dev)
        .unwrap_or_else(|| panic!("the backward case has no input `{name}`"))
}

/// The device's figures a backward launch depends on (`Gpu::open` reads both; eager's dw
/// order depends on them, so none is assumed).
fn device_shape(gpu: &Gpu) -> Result<DeviceShape, ExecError> {
    let threads_per_sm = gpu.info.threads_per_sm.ok_or_else(|| {
        launch_error(
            "a backward case",
            "the device's threads per SM were not read when its context opened".into(),
        )
    })?;
    Ok(DeviceShape {
        sms: gpu.info.sm_count as u64,
        threads_per_sm: threads_per_sm as u64,
    })
}

fn launch_error(what: &str, message: String) -> ExecError {
    ExecError::Launch {
        what: what.to_string(),
        message,
    }
}

/// Compile (cached per process) and look up the candidate's and the reference's entries.
fn load<'a>(
    gpu: &'a mut Gpu,
    bundle: &KernelBundle,
    spec: &CaseSpec,
) -> Result<Loaded<'a>, ExecError> {
    let m = &bundle.manifest;
    let dt = spec.dtype;
    let syms = m.stages.get(&dt).ok_or_else(|| ExecError::Compile {
        what: m.name.clone(),
        log: format!("no [entry.{dt}] table in kernel.toml"),
    })?;
    let tools = super::compile_with_tools(gpu, bundle, dt)?;
    let digest = bundle.digest().to_string();
    let opts = entry_options(&m.nvrtc_options, dt);
    let rd = tools.reference.clone();
    let (mut cand, mut refe) = (Vec::new(), Vec::new());
    for st in spec.op.stages() {
        let sym = syms.get(st.name).ok_or_else(|| ExecError::Compile {
            what: m.name.clone(),
            log: format!("[entry.{dt}] names no `{}` entry", st.name),
        })?;
        cand.push(Entry {
            stage: st,
            name: format!("{} ({sym})", m.name),
            f: gpu.function(&digest, &opts, sym)?,
        });
        refe.push(Entry {
            stage: st,
            name: format!("reference {}", st.name),
            f: gpu.function(
                &rd,
                &[],
                &reference_stage_symbol(spec.op, spec.semantics, st, dt),
            )?,
        });
    }
    Ok(Loaded {
        gpu: &*gpu,
        cand,
        refe,
        tools,
    })
}

/// Each entry's launch dimensions on `rows` rows, the grids of the entries that take any grid
/// changed by `grid` (stage name, default grid -> grid) when given.
fn dims(
    spec: &CaseSpec,
    entries: &[Entry],
    rows: u64,
    dev: DeviceShape,
    grid: Regrid<'_>,
) -> Result<Vec<LaunchDims>, ExecError> {
    entries
        .iter()
        .map(|e| {
            let mut d = stage_dims(spec.op, e.stage.name, rows, spec.cols, dev)
                .map_err(|m| launch_error(&e.name, m))?;
            if let Some(g) = grid {
                d.grid[0] = g(e.stage.name, d.grid[0]).max(1);
            }
            Ok(d)
        })
        .collect()
}

/// The entries' argument lists on `p`, `rows` rows.
fn args(
    spec: &CaseSpec,
    entries: &[Entry],
    p: &BackwardPtrs,
    rows: u64,
    dev: DeviceShape,
) -> Vec<Vec<Arg>> {
    entries
        .iter()
        .map(|e| stage_args(e.stage, p, rows, spec.cols, spec.eps, dev))
        .collect()
}

/// The entries as one launch sequence, with their dimensions `d` and argument lists `a`
/// ([`dims`], [`args`]): what the timed calls replay.
fn sequence<'a>(entries: &'a [Entry], d: &[LaunchDims], a: &'a [Vec<Arg>]) -> Vec<Launch<'a>> {
    entries
        .iter()
        .zip(d)
        .zip(a)
        .map(|((e, d), a)| Launch {
            what: &e.name,
            f: e.f,
            grid: d.grid,
            block: d.block,
            smem: d.shared_mem_bytes,
            args: a,
        })
        .collect()
}

/// One call on `rows` rows: every entry launched and waited for (each within the launch
/// limit), then the whole context idle.
fn call(
    run: &CaseRun<'_>,
    entries: &[Entry],
    p: &BackwardPtrs,
    rows: u64,
    dev: DeviceShape,
    grid: Regrid<'_>,
) -> Result<(), ExecError> {
    call_on(
        run.gpu,
        run.spec,
        run.limits.launch(),
        entries,
        p,
        rows,
        dev,
        grid,
    )
}

/// [`call`] without a [`CaseRun`]: on `gpu`, each launch within `limit`.
#[allow(clippy::too_many_arguments)]
fn call_on(
    gpu: &Gpu,
    spec: &CaseSpec,
    limit: Duration,
    entries: &[Entry],
    p: &BackwardPtrs,
    rows: u64,
    dev: DeviceShape,
    grid: Regrid<'_>,
) -> Result<(), ExecError> {
    let d = dims(spec, entries, rows, dev, grid)?;
    let a = args(spec, entries, p, rows, dev);
    for ((e, d), a) in entries.iter().zip(&d).zip(a) {
        gpu.launch(&e.name, e.f, d.grid, d.block, d.shared_mem_bytes, &a, limit)?;
    }
    gpu.wait_idle(&entries[0].name)
}

/// [`call`] queued: each entry's launch behind what is on the stream, none waited for (the
/// caller's `CaseRun::wait_queued` counts `entries.len()` launches a call).
fn call_queued(
    run: &CaseRun<'_>,
    entries: &[Entry],
    p: &BackwardPtrs,
    rows: u64,
    dev: DeviceShape,
) -> Result<(), ExecError> {
    let d = dims(run.spec, entries, rows, dev, None)?;
    let a = args(run.spec, entries, p, rows, dev);
    for ((e, d), a) in entries.iter().zip(&d).zip(a) {
        run.gpu
            .launch_queued(&e.name, e.f, d.grid, d.block, d.shared_mem_bytes, &a)?;
    }
    Ok(())
}

/// The inputs a backward call of `spec.op` uploads itself ([`OWN_INPUTS`] the case has).
fn upload_own(
    gpu: &Gpu,
    op: Op,
    inp: &CaseInputs,
) -> Result<Vec<(&'static str, DevBuf)>, ExecError> {
    let names = buffers(op);
    let mut own = Vec::new();
    for n in OWN_INPUTS {
        if let Some(h) = names.contains(&n).then(|| host_input(n, inp)).flatten() {
            let d = gpu.alloc(h.bytes.len())?;
            gpu.upload(&d, &h.bytes)?;
            own.push((n, d));
        }
    }
    Ok(own)
}

/// A backward call's inputs, in the order of [`buffers`]: (ABI name, host copy, device buffer).
fn call_inputs<'a>(
    op: Op,
    inp: &'a CaseInputs,
    bufs: &'a Bufs,
    own: &'a [(&'static str, DevBuf)],
) -> Vec<(&'static str, &'a HostTensor, &'a DevBuf)> {
    let grads = op.gradients();
    buffers(op)
        .into_iter()
        .filter(|n| *n != WORKSPACE && !grads.iter().any(|g| g.name == *n))
        .map(|n| {
            let (h, d) = input(n, inp, bufs, own);
            (n, h, d)
        })
        .collect()
}

/// The gradients' buffers of one call (each `rows x cols` or `cols`) and the workspace
/// (`ws_bytes`, where the op has one).
fn alloc_outs(gpu: &Gpu, spec: &CaseSpec, ws_bytes: usize) -> Result<Outs, ExecError> {
    Ok(Outs {
        grads: spec
            .op
            .gradients()
            .iter()
            .map(|g| gpu.alloc(spec.gradient_bytes(g)))
            .collect::<Result<_, _>>()?,
        ws: buffers(spec.op)
            .contains(&WORKSPACE)
            .then(|| gpu.alloc(ws_bytes))
            .transpose()?,
    })
}

/// Every buffer of a call by its ABI name: `o`'s gradients and workspace, then the inputs.
fn call_ptrs(op: Op, o: &Outs, inputs: &[(&'static str, &HostTensor, &DevBuf)]) -> BackwardPtrs {
    let mut p: Vec<(&'static str, u64)> = op
        .gradients()
        .iter()
        .zip(&o.grads)
        .map(|(g, b)| (g.name, b.ptr()))
        .collect();
    p.extend(o.ws.as_ref().map(|w| (WORKSPACE, w.ptr())));
    p.extend(inputs.iter().map(|(n, _, d)| (*n, d.ptr())));
    BackwardPtrs(p)
}

/// `o`'s gradients poisoned with `p` (`fill`: `kz_fill_pattern`), its workspace afresh.
fn poison_outs(gpu: &Gpu, fill: CUfunction, o: &Outs, p: Poison) -> Result<(), ExecError> {
    for b in &o.grads {
        gpu.fill_pattern(fill, b, p.key, p.invert)?;
    }
    match &o.ws {
        // the workspace holds nothing a call may read before writing it
        Some(w) => gpu.fill_pattern(fill, w, Poison::fresh().key, false),
        None => Ok(()),
    }
}

/// The reference layers of a backward case on its own inputs (`cases::generate(spec)`), for a
/// candidate measured in another process (a Python candidate, `crate::python`): reference.cu's
/// entries of the op (`crate::ref_module`) in [`Op::stages`] order with `stage_dims`, on
/// gradients and a workspace poisoned as `run_case` poisons the reference's (the workspace
/// sized by `workspace_bytes` for this device's SMs and threads per SM), every gradient
/// downloaded in [`Op::gradients`] order; with `reps > 0` the whole sequence's median time with
/// the L2 flushed, as `run_case` times the reference. The device's figures come back with it:
/// rms_norm_backward's reference dw depends on them (`Op::verdict_depends_on_device`).
pub(crate) fn reference_case(
    gpu: &mut Gpu,
    spec: &CaseSpec,
    reps: u32,
) -> Result<BackwardReferenceOutputs, ExecError> {
    let (op, dt, rows, cols) = (spec.op, spec.dtype, spec.rows, spec.cols);
    if !op.is_backward() {
        return Err(ExecError::Sandbox(format!(
            "{}: {op} is not a backward op (its reference is `Request::Reference`)",
            spec.id
        )));
    }
    let dev = device_shape(gpu)?;
    let (rd, rsrc) = crate::ref_module::module(op, spec.semantics, spec.dtype);
    gpu.compile(rd, "reference layers", rsrc, &[])?;
    let fill = gpu.function(rd, &[], "kz_fill_pattern")?;
    let refe: Vec<Entry> = op
        .stages()
        .iter()
        .map(|st| {
            Ok(Entry {
                stage: st,
                name: format!("reference {}", st.name),
                f: gpu.function(rd, &[], &reference_stage_symbol(op, spec.semantics, st, dt))?,
            })
        })
        .collect::<Result<_, ExecError>>()?;
    let gpu = &*gpu;
    let ws_bytes = workspace_bytes(op, rows, cols, dev)
        .map_err(|m| launch_error("the workspace", m))? as usize;
    let inp = cases::generate(spec);
    let bufs = Bufs::upload(gpu, &inp)?;
    let own = upload_own(gpu, op, &inp)?;
    let inputs = call_inputs(op, &inp, &bufs, &own);
    let o = alloc_outs(gpu, spec, ws_bytes)?;
    let ptrs = call_ptrs(op, &o, &inputs);
    let limit = Duration::from_secs(120);
    poison_outs(gpu, fill, &o, Poison::fresh())?;
    call_on(gpu, spec, limit, &refe, &ptrs, rows, dev, None)?;
    let grads: Grads = o
        .grads
        .iter()
        .map(|b| gpu.download_vec(b))
        .collect::<Result<_, _>>()?;
    let median_us = if reps > 0 {
        let d = dims(spec, &refe, rows, dev, None)?;
        let a = args(spec, &refe, &ptrs, rows, dev);
        let seq = sequence(&refe, &d, &a);
        let mut prepare = || poison_outs(gpu, fill, &o, Poison::fresh());
        Some(gpu.time_sequence(
            &seq,
            crate::cuda::Reps::reference(reps as usize),
            limit,
            &mut prepare,
            &mut |_| Ok(()),
        )?)
    } else {
        None
    };
    Ok(BackwardReferenceOutputs {
        grads,
        median_us,
        sms: dev.sms,
        threads_per_sm: dev.threads_per_sm,
    })
}

/// Run one backward case of `bundle` and measure it.
pub(crate) fn run_case(
    gpu: &mut Gpu,
    bundle: &KernelBundle,
    spec: &CaseSpec,
    limits: &Limits,
    copy_gbps: f64,
) -> Result<CaseReport, ExecError> {
    let (op, dt, rows, cols) = (spec.op, spec.dtype, spec.rows, spec.cols);
    let mut phases = super::Phases::start(&spec.id);
    let dev = device_shape(gpu)?;
    let Loaded {
        gpu,
        cand,
        refe,
        tools,
    } = load(gpu, bundle, spec)?;
    let es = dt.size_bytes();
    let grads = op.gradients();
    let ws_bytes = workspace_bytes(op, rows, cols, dev)
        .map_err(|m| launch_error("the workspace", m))? as usize;
    phases.mark("load");
    let crate::ahead::Drawn {
        inputs: inp,
        truths,
        ahead,
    } = crate::ahead::take(spec);
    phases.mark(if ahead {
        "generate (ahead)"
    } else {
        "generate"
    });
    let own = upload_own(gpu, op, &inp)?;
    // The measurements' shared helpers (keyed sums, poison) through a CaseRun whose kernels
    // are the first entries (the only launches made through it are `call`'s).
    let kern = |e: &Entry| Kern {
        name: e.name.clone(),
        f: e.f,
        dims: Box::new(|_, _| Err("a backward entry is launched by measure::backward".into())),
    };
    let run = CaseRun {
        gpu,
        spec,
        limits,
        cand: kern(&cand[0]),
        refk: kern(&refe[0]),
        tools,
        bufs: Bufs::upload(gpu, &inp)?,
        sum_buf: gpu.alloc(8)?,
    };
    // The inputs, in the order of `buffers(op)`: (ABI name, host copy, device buffer).
    let inputs = call_inputs(op, &inp, &run.bufs, &own);
    let alloc = || alloc_outs(gpu, spec, ws_bytes);
    let ptrs = |o: &Outs| call_ptrs(op, o, &inputs);
    let poison = |o: &Outs, p: Poison| poison_outs(gpu, run.tools.fill, o, p);
    let download = |o: &Outs| -> Result<Grads, ExecError> {
        o.grads.iter().map(|b| gpu.download_vec(b)).collect()
    };
    let out = alloc()?;
    phases.mark("upload");

    // 1. The candidate: three calls, then one at other grids of the entries that take any.
    // Call 1's gradients are downloaded; a later call's share that copy where every gradient
    // holds its bits (keyed sums on the GPU, the host's sums made once: `first`), and are
    // downloaded only where one differs.
    let p1 = Poison::fresh();
    poison(&out, p1)?;
    call(&run, &cand, &ptrs(&out), rows, dev, None)?;
    let call1 = Arc::new(download(&out)?);
    // One key for the case's later checks: call 1's gradients, then the inputs' host copies.
    let mut held: Vec<Held> = run.expect_all(
        &call1
            .iter()
            .map(Vec::as_slice)
            .chain(inputs.iter().map(|(_, t, _)| t.bytes.as_slice()))
            .collect::<Vec<_>>(),
    );
    let held_inputs = held.split_off(call1.len());
    let first = held;
    let same_or_download = |o: &Outs| -> Result<Arc<Grads>, ExecError> {
        for (b, h) in o.grads.iter().zip(&first) {
            if !run.still_holds(b, h)? {
                return Ok(Arc::new(download(o)?));
            }
        }
        Ok(Arc::clone(&call1))
    };
    let mut got: Vec<Arc<Grads>> = vec![Arc::clone(&call1)];
    for p in [p1.inverted(), Poison::fresh()] {
        poison(&out, p)?;
        call(&run, &cand, &ptrs(&out), rows, dev, None)?;
        got.push(same_or_download(&out)?);
    }
    let small = rows * cols <= 1 << 20;
    let other_grid = move |stage: &str, g: u32| -> u32 {
        if !any_grid(op, stage) {
            g
        } else if small {
            1
        } else {
            g / 3
        }
    };
    poison(&out, Poison::fresh())?;
    call(&run, &cand, &ptrs(&out), rows, dev, Some(&other_grid))?;
    let regridded = same_or_download(&out)?;
    phases.mark("4 candidate calls");

    // 2. The reference, after it, on buffers of its own (poisoned before they are freed).
    let refo = alloc()?;
    poison(&refo, Poison::fresh())?;
    call(&run, &refe, &ptrs(&refo), rows, dev, None)?;
    let refg = download(&refo)?;
    phases.mark("reference");

    // 3. Integrity.
    let mut integrity = Vec::new();
    // (Calls 1 and 2 ran on inverse poisons: where call 2 gave call 1's very bits, every
    // element was written, since an unwritten one differs in every bit.)
    let both_wrote = Arc::ptr_eq(&got[0], &got[1]);
    for (k, g) in grads.iter().enumerate().filter(|_| !both_wrote) {
        let (n, at) = poison::never_written(&got[0][k], &got[1][k], p1, es);
        if n > 0 {
            let r = if g.one_row { 1 } else { rows };
            integrity.push(format!(
                "{}: {}",
                g.name,
                unwritten_line(n, at.unwrap_or(0), r, cols)
            ));
        }
    }
    let guarded: Vec<(&str, &DevBuf)> = grads
        .iter()
        .map(|g| g.name)
        .zip(&out.grads)
        .chain(out.ws.as_ref().map(|w| (WORKSPACE, w)))
        .chain(inputs.iter().map(|(n, _, d)| (*n, *d)))
        .collect();
    for (name, buf) in guarded {
        for g in gpu.check_guards(buf)? {
            integrity.push(format!("{name}: {g}"));
        }
    }
    for ((_, t, d), h) in inputs.iter().zip(&held_inputs) {
        if !run.still_holds(d, h)? {
            integrity.push(format!("input {} was modified by the kernel", t.name));
        }
    }

    phases.mark("integrity");

    // 4. Determinism: the three calls and the call at other grids.
    let all: Vec<Vec<&[u8]>> = got
        .iter()
        .chain(std::iter::once(&regridded))
        .map(|c| c.iter().map(Vec::as_slice).collect())
        .collect();
    // Calls that shared call 1's copy (the same bits, checked on the GPU) differ in nothing;
    // only the others are compared element by element.
    let differing = |k: usize| -> u64 {
        let other = if k == 3 { &regridded } else { &got[k] };
        if Arc::ptr_eq(other, &got[0]) {
            0
        } else {
            determinism::max_differing(dt, &[all[0].clone(), all[k].clone()])
        }
    };
    let repeated = differing(1).max(differing(2));
    let by_grid = differing(3);
    let deterministic = repeated == 0 && by_grid == 0;
    let mut notes: Vec<String> = determinism::note(repeated).into_iter().collect();
    if by_grid > 0 {
        notes.push(format!(
            "the persistent entries at other grids give other bits in up to {by_grid} element(s) (the ABI promises any grid gives the same)"
        ));
    }

    phases.mark("determinism");

    // Batch invariance of the rows x cols gradients (none where a gradient sums the rows):
    // every row recomputed in other batch compositions against call 1's.
    let batch_invariant = if spec.check_batch {
        // When deterministic, `out` holds call 1's bits (the call at other grids gave them too).
        let copies: Option<Vec<DevBuf>> = if deterministic {
            None
        } else {
            Some(
                got[0]
                    .iter()
                    .map(|h| -> Result<DevBuf, ExecError> {
                        let b = gpu.alloc(h.len())?;
                        gpu.upload(&b, h)?;
                        Ok(b)
                    })
                    .collect::<Result<_, _>>()?,
            )
        };
        let base: Vec<&DevBuf> = copies.as_ref().unwrap_or(&out.grads).iter().collect();
        let differ = batch_check(&run, &cand, dev, &inputs, &base)?;
        let ok = differ.is_none();
        notes.extend(differ);
        Some(ok)
    } else {
        None
    };

    phases.mark("batch invariance");

    // Address cases: a deterministic kernel's gradients wherever its buffers lie.
    if deterministic {
        let out_bytes: Vec<usize> = out
            .grads
            .iter()
            .chain(out.ws.as_ref())
            .map(|b| b.bytes)
            .collect();
        let held_all: Vec<&Held> = first.iter().chain(&held_inputs).collect();
        integrity.extend(placements(
            &run, &cand, dev, &inputs, &out_bytes, &got[0], &held_all,
        )?);
    }

    // 5, 6. Exactness per gradient against the reference (the worst call, at other grids too,
    // when they differ), their combination, and accuracy against the f64 oracle: from host
    // bytes, as a Python candidate's (`gradients::verdict`).
    let refs: Vec<&[u8]> = refg.iter().map(Vec::as_slice).collect();
    phases.mark("address placements");
    let verdict =
        super::gradients::verdict(spec, &inp, &all, &refs, deterministic, truths.as_deref());
    phases.mark("exactness+oracle (host)");

    // 7. Speed: the whole call, each timed run's gradients checked.
    let speed = if spec.measure_speed {
        let reps = limits.speed_reps.max(3) as usize;
        let time = |entries: &[Entry],
                    o: &Outs,
                    expect: Option<&[Held]>,
                    bad: &mut Vec<usize>,
                    reps: Reps|
         -> Result<f64, ExecError> {
            let d = dims(spec, entries, rows, dev, None)?;
            let a = args(spec, entries, &ptrs(o), rows, dev);
            let seq = sequence(entries, &d, &a);
            let mut prepare = || poison(o, Poison::fresh());
            let mut check = |rep: usize| -> Result<(), ExecError> {
                if let Some(want) = expect {
                    gpu.wait_idle(&entries[0].name)?;
                    for (b, w) in o.grads.iter().zip(want) {
                        if !run.still_holds(b, w)? {
                            bad.push(rep);
                            break;
                        }
                    }
                }
                Ok(())
            };
            gpu.time_sequence(&seq, reps, limits.launch(), &mut prepare, &mut check)
        };
        let mut bad = Vec::new();
        let c = time(&cand, &out, Some(&first), &mut bad, Reps::all(reps))?;
        let r = time(&refe, &refo, None, &mut Vec::new(), Reps::reference(reps))?;
        let s = speed::speed_of(op.bytes_moved(dt, rows, cols), c, r, copy_gbps);
        integrity.extend(speed::wrong_timed_launches(&bad, reps));
        integrity.extend(s.above_roofline());
        Some(s)
    } else {
        None
    };
    poison(&refo, Poison::fresh())?;
    phases.mark("speed");

    Ok(CaseReport {
        note: (!notes.is_empty()).then(|| notes.join("; ")),
        exactness: Some(verdict.exactness),
        accuracy: None,
        deterministic: Some(deterministic),
        batch_invariant,
        integrity_failures: integrity,
        speed,
        gradients: verdict.gradients,
        ..cases::case_skeleton(spec, CaseStatus::Ran, None)
    })
}

/// Batch invariance of a backward call whose gradients are all `rows x cols`: every
/// composition of `batch::plan` laid out in one allocation per `rows x cols` tensor (the
/// inputs gathered there from the case's, the gradients poisoned once, a workspace of each
/// batch's own size where the op has one), one call per batch on its slices, and every row of
/// every gradient compared on the GPU with the same row of `base` (call 1's gradients, in
/// [`Op::gradients`] order). `None` when every row matched, else a note per composition
/// saying how many rows differed and where.
fn batch_check(
    run: &CaseRun<'_>,
    entries: &[Entry],
    dev: DeviceShape,
    inputs: &[(&'static str, &HostTensor, &DevBuf)],
    base: &[&DevBuf],
) -> Result<Option<String>, ExecError> {
    let (gpu, spec) = (run.gpu, run.spec);
    let op = spec.op;
    let grads = op.gradients();
    assert!(
        grads.iter().all(|g| !g.one_row),
        "{op}: batch invariance of a gradient summed over the rows"
    );
    let es = spec.dtype.size_bytes() as u64;
    let row = spec.cols * es;
    let row_wise = |t: &HostTensor| t.bytes.len() as u64 == spec.rows * row;
    let mut notes = Vec::new();
    for comp in batch::plan(spec.rows, spec.seed ^ 0xBA7C) {
        let k = comp.batches.len();
        let l = batch::layout(&comp.batches, row);
        let idx = batch::upload_rows(gpu, &comp.batches)?;
        // the rows x cols inputs laid out per batch; one-row inputs (a weight) as they are
        let laid: Vec<Option<DevBuf>> = inputs
            .iter()
            .map(|(_, t, _)| row_wise(t).then(|| gpu.alloc(l.total as usize)).transpose())
            .collect::<Result<_, _>>()?;
        let outs: Vec<DevBuf> = grads
            .iter()
            .map(|_| gpu.alloc(l.total as usize))
            .collect::<Result<_, _>>()?;
        let p = Poison::fresh();
        for o in &outs {
            gpu.fill_pattern(run.tools.fill, o, p.key, p.invert)?;
        }
        let res = batch::result_slots(run, k * grads.len())?;
        let mut idx_at = 0u64;
        for (i, b) in comp.batches.iter().enumerate() {
            let n = b.len() as u64;
            let idx_ptr = idx.ptr() + 8 * idx_at;
            let at = l.offsets[i];
            let mut ptrs: Vec<(&'static str, u64)> = grads
                .iter()
                .zip(&outs)
                .map(|(g, o)| (g.name, o.ptr() + at))
                .collect();
            let ws = match workspace_bytes(op, n, spec.cols, dev)
                .map_err(|m| launch_error("the workspace", m))?
            {
                0 => None,
                bytes => Some(gpu.alloc(bytes as usize)?),
            };
            if let Some(w) = &ws {
                gpu.fill_pattern(run.tools.fill, w, Poison::fresh().key, false)?;
                ptrs.push((WORKSPACE, w.ptr()));
            }
            for ((name, _, src), dst) in inputs.iter().zip(&laid) {
                match dst {
                    Some(d) => {
                        run.gather(d.ptr() + at, src, idx_ptr, n, row)?;
                        ptrs.push((name, d.ptr() + at));
                    }
                    None => ptrs.push((name, src.ptr())),
                }
            }
            call(run, entries, &BackwardPtrs(ptrs), n, dev, None)?;
            for (slot, (o, b)) in outs.iter().zip(base).enumerate() {
                let r = res.ptr() + 16 * (i * grads.len() + slot) as u64;
                batch::enqueue_rows_differ(run, o.ptr() + at, b.ptr(), idx_ptr, n, row, r)?;
            }
            idx_at += n;
        }
        let got = gpu.download_vec(&res)?;
        notes.extend(batch::composition_note(&comp, &got, grads.len()));
    }
    Ok((!notes.is_empty()).then(|| notes.join("; ")))
}

/// The address cases of a backward call (`address::plan` over its buffers, [`buffers`]): at
/// each placement the gradients poisoned, the workspace poisoned, the inputs copied, one call
/// of `entries`; then the gradients must hold `expected`'s bits (call 1's at fresh allocations),
/// the inputs theirs, and every guard region its bytes, all checked on the GPU by keyed sums
/// downloaded once a placement (`address::PlacedSums`, as the forward's address cases).
/// `out_bytes` are the sizes of the gradients then the workspace; `held` what the gradients
/// (call 1's) and the inputs must hold, with the case's one key (`CaseRun::expect_all`). Returns the integrity failures: one line for gradients that
/// depend on the address (the first placement that differed, how many did), and up to
/// `MAX_OTHER_LINES` for inputs modified or guards written at a placement.
fn placements(
    run: &CaseRun<'_>,
    entries: &[Entry],
    dev: DeviceShape,
    inputs: &[(&'static str, &HostTensor, &DevBuf)],
    out_bytes: &[usize],
    expected: &Grads,
    held: &[&Held],
) -> Result<Vec<String>, ExecError> {
    let (gpu, spec) = (run.gpu, run.spec);
    let names = buffers(spec.op);
    let n_out = out_bytes.len();
    assert_eq!(names.len(), n_out + inputs.len());
    let sizes: Vec<usize> = out_bytes
        .iter()
        .copied()
        .chain(inputs.iter().map(|(_, _, d)| d.bytes))
        .collect();
    let mut placed: Vec<DevBuf> = sizes
        .iter()
        .map(|&b| gpu.alloc_placed(b, PERIOD))
        .collect::<Result<_, _>>()?;
    let plan = address::plan(names.len());
    // What each placed buffer must sum to: the gradients call 1's, the inputs their host
    // copies, as `held` (the case's one key) says (the workspace's payload is not checked: a
    // call may leave anything there).
    let n_grads = expected.len();
    assert_eq!(held.len(), n_grads + inputs.len());
    let sums = address::PlacedSums::sharing(gpu, placed.len(), held[0])?;
    let want: Vec<Option<u64>> = (0..names.len())
        .map(|i| match i.checked_sub(n_out) {
            Some(k) => Some(held[n_grads + k].sum),
            None => (i < n_grads).then(|| held[i].sum),
        })
        .collect();
    // the gradients and workspace poisoned, the inputs copied
    let sources: Vec<Option<&DevBuf>> = (0..placed.len())
        .map(|i| i.checked_sub(n_out).map(|k| inputs[k].2))
        .collect();
    let ptrs_of = |placed: &[DevBuf]| {
        BackwardPtrs(
            names
                .iter()
                .copied()
                .zip(placed.iter().map(DevBuf::ptr))
                .collect(),
        )
    };
    let summed_ok = |i: usize, s: &address::Summed| want[i].is_none_or(|w| s.payload == w);
    let launch = |placed: &[DevBuf]| call_queued(run, entries, &ptrs_of(placed), spec.rows, dev);
    let calls = (entries[0].name.as_str(), entries.len());
    let placing = address::Placing::new(
        gpu,
        (run.tools.place, run.tools.keyed_sums),
        &plan,
        &mut placed,
        &sources,
    )?;
    let flagged = placing.screen(run, &plan, &mut placed, &sums, launch, calls, summed_ok)?;
    let mut first: Option<(Placement, Vec<Difference>)> = None;
    let mut differing = 0usize;
    let mut other: Vec<String> = Vec::new();
    for (k, screened) in flagged {
        // Again, alone, to see what differs.
        let p = &plan[k];
        let got = placing.again(run, (k, p), &mut placed, &sums, launch, calls)?;
        let at = address::describe(&names, p);
        let mut diffs = Vec::new();
        let lines_before = other.len();
        for (i, buf) in placed.iter().enumerate() {
            let payload_ok = summed_ok(i, &got[i]);
            if payload_ok && got[i].guards_ok {
                continue;
            }
            // Only when something differs: download and say what.
            if !payload_ok {
                let now = gpu.download_vec(buf)?;
                match i.checked_sub(n_out) {
                    None => diffs.extend(Difference::of(names[i], spec.dtype, &now, &expected[i])),
                    Some(k) => other.push(format!(
                        "with {at}: input {} was modified by the kernel",
                        inputs[k].0
                    )),
                }
            }
            if !got[i].guards_ok {
                let lines = gpu.check_guards(buf)?;
                if lines.is_empty() {
                    other.push(format!(
                        "with {at}: {}: the guard regions changed",
                        names[i]
                    ));
                }
                other.extend(
                    lines
                        .into_iter()
                        .map(|g| format!("with {at}: {}: {g}", names[i])),
                );
            }
        }
        if diffs.is_empty() && other.len() == lines_before {
            // Nothing the second time: what the screening call's sums showed stands.
            for (i, s) in screened.iter().enumerate() {
                let input = i >= n_out;
                let lines = address::unrepeated(names[i], s, Some(summed_ok(i, s)), input);
                other.extend(lines.into_iter().map(|l| format!("with {at}: {l}")));
            }
        }
        if !diffs.is_empty() {
            differing += 1;
            if first.is_none() {
                first = Some((p.clone(), diffs));
            }
        }
    }
    let mut out: Vec<String> = first
        .iter()
        .map(|(p, d)| {
            address::address_line(&names, (p, d.as_slice()), differing, plan.len(), spec.cols)
        })
        .collect();
    let more = other.len().saturating_sub(address::MAX_OTHER_LINES);
    other.truncate(address::MAX_OTHER_LINES);
    out.extend(other);
    if more > 0 {
        out.push(format!(
            "{more} more input or guard failure(s) at placed addresses"
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The buffers of each backward op's call in the order the address cases place them:
    /// rms_norm_backward's as before the generalisation (its report lines name them so).
    #[test]
    fn the_buffers_of_a_call_are_the_gradients_the_workspace_and_the_inputs() {
        assert_eq!(
            buffers(Op::RmsNormBackward),
            ["dx", "dw", "ws", "dy", "x", "w"]
        );
        assert_eq!(
            buffers(Op::SiluMulBackward),
            ["d_gate", "d_up", "dy", "gate", "up"]
        );
        assert_eq!(
            buffers(Op::LayerNormBackward),
            ["dx", "dw", "db", "dy", "x", "mean", "rstd", "w"]
        );
        for op in [Op::SiluBackward, Op::GeluBackward, Op::GeluTanhBackward] {
            assert_eq!(buffers(op), ["dx", "dy", "x"], "{op}");
        }
        assert_eq!(
            buffers(Op::FusedAddRmsNormBackward),
            ["dx", "dw", "ws", "dy", "dres", "x", "w"]
        );
        for &op in Op::ALL.iter().filter(|o| o.is_backward()) {
            let b = buffers(op);
            let mut all: Vec<&str> = op.stages().iter().flat_map(|s| s.tensors()).collect();
            all.sort_unstable();
            all.dedup();
            let mut sorted = b.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, all, "{op}: every tensor once");
            // the address plan takes this many buffers
            assert!(!address::plan(b.len()).is_empty(), "{op}");
        }
    }

    /// Every input of a backward case maps to a tensor the case draws.
    #[test]
    fn every_input_of_a_backward_call_is_drawn() {
        for &op in Op::ALL.iter().filter(|o| o.is_backward()) {
            let spec = cases::suite(
                op,
                op.default_semantics(),
                &[kernel_registry::DType::Bf16],
                true,
                1,
                &[],
            )
            .into_iter()
            .find(|s| s.rows * s.cols < 10_000)
            .expect("a small case");
            let inp = cases::generate(&spec);
            let grads: Vec<&str> = op.gradients().iter().map(|g| g.name).collect();
            for n in buffers(op) {
                if n == WORKSPACE || grads.contains(&n) {
                    continue;
                }
                assert!(
                    host_input(n, &inp).is_some(),
                    "{op}: the case draws no `{n}`"
                );
            }
        }
    }
}
