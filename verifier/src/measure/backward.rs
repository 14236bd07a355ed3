//! One case of a backward op (docs/spec.md section 2c; docs/backward.md, "What a verification
//! measures"). The candidate's entries run in [`Op::stages`] order on one stream with
//! `kernel_registry::backward`'s grids: three times with `dx` and `dw` poisoned afresh (launch 2
//! on launch 1's poison inverted) and the workspace poisoned afresh, then once more with other
//! grids for the persistent entries (the ABI promises any grid gives the same bits). Then the
//! reference's entries (reference.cu, the same ABI) on buffers of their own. Measured: each
//! gradient's exactness against the reference and accuracy against the f64 oracle, and their
//! combination; determinism (repeated launches and the other grids); integrity (every element
//! of dx and dw written, the guards of all six buffers, inputs unchanged, a time limit per
//! launch); speed (the whole sequence, every timed run's gradients checked on the GPU).
//!
//! Address cases as the forward's (`address::plan`): a deterministic kernel's call with the six
//! buffers at every placement, its gradients equal to call 1's, inputs unchanged, guards intact.
//!
//! Not yet: batch invariance of dx.

use super::address::{self, Difference, Placement, PERIOD};
use super::poison::{self, Poison};
use super::{determinism, integrity::unwritten_line, speed, CaseRun, Kern, Tools};
use crate::abi::{reference_digest, reference_stage_symbol, stage_args, BackwardPtrs, Bufs};
use crate::cases::HostTensor;
use crate::cases::{self, CaseSpec};
use crate::cuda::{guard_byte, Arg, DevBuf, Gpu, Launch};
use crate::exec::{ExecError, Limits};
use crate::numeric::{combine, compare, worst};
use crate::oracle;
use cudarc::driver::sys::CUfunction;
use kernel_registry::backward::{stage_dims, workspace_bytes, DeviceShape};
use kernel_registry::manifest::{entry_options, LaunchDims};
use kernel_registry::report::{CaseReport, CaseStatus, Exactness, GradientReport};
use kernel_registry::{KernelBundle, Stage};
use std::collections::BTreeMap;

/// A change of the persistent entries' grids: (stage name, default grid) -> grid.
type Regrid<'a> = Option<&'a dyn Fn(&str, u32) -> u32>;

/// One call's gradients as downloaded: (dx, dw).
type Grads = (Vec<u8>, Vec<u8>);

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

/// The buffers one call writes (`dx`, `dw`, the workspace `ws`).
struct Outs {
    dx: DevBuf,
    dw: DevBuf,
    ws: DevBuf,
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
    let rd = reference_digest();
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

/// Each entry's launch dimensions, the persistent entries' grids changed by `grid` (stage
/// name, default grid -> grid) when given.
fn dims(
    spec: &CaseSpec,
    entries: &[Entry],
    dev: DeviceShape,
    grid: Regrid<'_>,
) -> Result<Vec<LaunchDims>, ExecError> {
    entries
        .iter()
        .map(|e| {
            let mut d = stage_dims(spec.op, e.stage.name, spec.rows, spec.cols, dev)
                .map_err(|m| launch_error(&e.name, m))?;
            if let Some(g) = grid {
                d.grid[0] = g(e.stage.name, d.grid[0]).max(1);
            }
            Ok(d)
        })
        .collect()
}

/// The entries' argument lists on `p`.
fn args(spec: &CaseSpec, entries: &[Entry], p: BackwardPtrs, dev: DeviceShape) -> Vec<Vec<Arg>> {
    entries
        .iter()
        .map(|e| stage_args(e.stage, p, spec.rows, spec.cols, spec.eps, dev))
        .collect()
}

/// One call: every entry launched and waited for (each within the launch limit), then the
/// whole context idle.
fn call(
    run: &CaseRun<'_>,
    entries: &[Entry],
    p: BackwardPtrs,
    dev: DeviceShape,
    grid: Regrid<'_>,
) -> Result<(), ExecError> {
    let d = dims(run.spec, entries, dev, grid)?;
    for ((e, d), a) in entries.iter().zip(&d).zip(args(run.spec, entries, p, dev)) {
        run.gpu.launch(
            &e.name,
            e.f,
            d.grid,
            d.block,
            d.shared_mem_bytes,
            &a,
            run.limits.launch(),
        )?;
    }
    run.gpu.wait_idle(&entries[0].name)
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
    let dev = device_shape(gpu)?;
    let Loaded {
        gpu,
        cand,
        refe,
        tools,
    } = load(gpu, bundle, spec)?;
    let es = dt.size_bytes();
    let ws_bytes = workspace_bytes(op, rows, cols, dev)
        .map_err(|m| launch_error("the workspace", m))? as usize;
    let inp = cases::generate(spec);
    let dy_host = inp.dy.as_ref().expect("a backward case has dy");
    let dy = gpu.alloc(dy_host.bytes.len())?;
    gpu.upload(&dy, &dy_host.bytes)?;
    // The measurements' shared helpers (keyed sums, poison) through a CaseRun whose kernels
    // are the dx entries (the only launches made through it are `call`'s).
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
    let w = run.bufs.weight.as_ref().expect("rms_norm_backward has w");
    let alloc = || -> Result<Outs, ExecError> {
        Ok(Outs {
            dx: gpu.alloc((rows * cols) as usize * es)?,
            dw: gpu.alloc(cols as usize * es)?,
            ws: gpu.alloc(ws_bytes)?,
        })
    };
    let ptrs = |o: &Outs| BackwardPtrs {
        dx: o.dx.ptr(),
        dw: o.dw.ptr(),
        ws: o.ws.ptr(),
        dy: dy.ptr(),
        x: run.bufs.x.ptr(),
        w: w.ptr(),
    };
    let poison = |o: &Outs, p: Poison| -> Result<(), ExecError> {
        gpu.fill_pattern(run.tools.fill, &o.dx, p.key, p.invert)?;
        gpu.fill_pattern(run.tools.fill, &o.dw, p.key, p.invert)?;
        // the workspace holds nothing a call may read before writing it
        gpu.fill_pattern(run.tools.fill, &o.ws, Poison::fresh().key, false)
    };
    let out = alloc()?;

    // 1. The candidate: three calls, then one at other grids of the persistent entries.
    let p1 = Poison::fresh();
    let mut got: Vec<Grads> = Vec::new();
    for p in [p1, p1.inverted(), Poison::fresh()] {
        poison(&out, p)?;
        call(&run, &cand, ptrs(&out), dev, None)?;
        got.push((gpu.download_vec(&out.dx)?, gpu.download_vec(&out.dw)?));
    }
    let small = rows * cols <= 1 << 20;
    let other_grid = move |stage: &str, g: u32| -> u32 {
        match stage {
            "dw" => g,
            _ if small => 1,
            _ => g / 3,
        }
    };
    poison(&out, Poison::fresh())?;
    call(&run, &cand, ptrs(&out), dev, Some(&other_grid))?;
    let regridded = (gpu.download_vec(&out.dx)?, gpu.download_vec(&out.dw)?);

    // 2. The reference, after it, on buffers of its own (poisoned before they are freed).
    let refo = alloc()?;
    poison(&refo, Poison::fresh())?;
    call(&run, &refe, ptrs(&refo), dev, None)?;
    let (rdx, rdw) = (gpu.download_vec(&refo.dx)?, gpu.download_vec(&refo.dw)?);

    // 3. Integrity.
    let mut integrity = Vec::new();
    for (name, first, second, r) in [
        ("dx", &got[0].0, &got[1].0, rows),
        ("dw", &got[0].1, &got[1].1, 1),
    ] {
        let (n, at) = poison::never_written(first, second, p1, es);
        if n > 0 {
            integrity.push(format!(
                "{name}: {}",
                unwritten_line(n, at.unwrap_or(0), r, cols)
            ));
        }
    }
    for (name, buf) in [
        ("dx", &out.dx),
        ("dw", &out.dw),
        ("ws", &out.ws),
        ("dy", &dy),
        ("x", &run.bufs.x),
        ("w", w),
    ] {
        for g in gpu.check_guards(buf)? {
            integrity.push(format!("{name}: {g}"));
        }
    }
    for (t, d) in [
        (&inp.x, &run.bufs.x),
        (dy_host, &dy),
        (inp.weight.as_ref().expect("w"), w),
    ] {
        if !run.holds(d, &t.bytes)? {
            integrity.push(format!("input {} was modified by the kernel", t.name));
        }
    }

    // 4. Determinism: the three calls and the call at other grids.
    let all: Vec<Vec<&[u8]>> = got
        .iter()
        .chain(std::iter::once(&regridded))
        .map(|(a, b)| vec![a.as_slice(), b.as_slice()])
        .collect();
    let repeated = determinism::max_differing(dt, &all[..3]);
    let by_grid = determinism::max_differing(dt, &[all[0].clone(), all[3].clone()]);
    let deterministic = repeated == 0 && by_grid == 0;
    let mut notes: Vec<String> = determinism::note(repeated).into_iter().collect();
    if by_grid > 0 {
        notes.push(format!(
            "the persistent entries at other grids give other bits in up to {by_grid} element(s) (the ABI promises any grid gives the same)"
        ));
    }

    // Address cases: a deterministic kernel's gradients wherever its buffers lie.
    if deterministic {
        let inputs = [
            (dy_host, &dy),
            (&inp.x, &run.bufs.x),
            (inp.weight.as_ref().expect("w"), w),
        ];
        let sizes = [out.dx.bytes, out.dw.bytes, out.ws.bytes];
        integrity.extend(placements(&run, &cand, dev, inputs, sizes, &got[0])?);
    }

    // 5. Exactness per gradient (the worst call when they differ), and their combination.
    let grad = |k: usize, which: fn(&Grads) -> &Vec<u8>, refr: &[u8]| {
        let calls = got.iter().chain(std::iter::once(&regridded));
        let n = if deterministic { 1 } else { k };
        calls
            .take(n)
            .map(|c| compare(dt, &[(which(c).as_slice(), refr)]))
            .reduce(worst)
            .expect("at least one call")
    };
    let e_dx: Exactness = grad(4, |c| &c.0, &rdx);
    let e_dw: Exactness = grad(4, |c| &c.1, &rdw);
    let exactness = combine(&[&e_dx, &e_dw]);

    // 6. Accuracy against the f64 oracle, per gradient.
    let (a_dx, a_dw) = oracle::backward_accuracy(spec, &inp, (&got[0].0, &rdx), (&got[0].1, &rdw));

    // 7. Speed: the whole call, each timed run's gradients checked.
    let speed = if spec.measure_speed {
        let reps = limits.speed_reps.max(3) as usize;
        let time = |entries: &[Entry],
                    o: &Outs,
                    expect: Option<(&[u8], &[u8])>,
                    bad: &mut Vec<usize>|
         -> Result<f64, ExecError> {
            let d = dims(spec, entries, dev, None)?;
            let a = args(spec, entries, ptrs(o), dev);
            let seq: Vec<Launch<'_>> = entries
                .iter()
                .zip(&d)
                .zip(&a)
                .map(|((e, d), a)| Launch {
                    what: &e.name,
                    f: e.f,
                    grid: d.grid,
                    block: d.block,
                    smem: d.shared_mem_bytes,
                    args: a,
                })
                .collect();
            let mut prepare = || poison(o, Poison::fresh());
            let mut check = |rep: usize| -> Result<(), ExecError> {
                if let Some((ex, ew)) = expect {
                    gpu.wait_idle(&entries[0].name)?;
                    if !(run.holds(&o.dx, ex)? && run.holds(&o.dw, ew)?) {
                        bad.push(rep);
                    }
                }
                Ok(())
            };
            gpu.time_sequence(&seq, reps, limits.launch(), &mut prepare, &mut check)
        };
        let mut bad = Vec::new();
        let c = time(&cand, &out, Some((&got[0].0, &got[0].1)), &mut bad)?;
        let r = time(&refe, &refo, None, &mut Vec::new())?;
        let s = speed::speed_of(op.bytes_moved(dt, rows, cols), c, r, copy_gbps);
        integrity.extend(speed::wrong_timed_launches(&bad, reps));
        integrity.extend(s.above_roofline());
        Some(s)
    } else {
        None
    };
    poison(&refo, Poison::fresh())?;

    let gradients: BTreeMap<String, GradientReport> = [("dx", e_dx, a_dx), ("dw", e_dw, a_dw)]
        .into_iter()
        .map(|(k, exactness, accuracy)| {
            (
                k.to_string(),
                GradientReport {
                    exactness,
                    accuracy: Some(accuracy),
                },
            )
        })
        .collect();
    Ok(CaseReport {
        note: (!notes.is_empty()).then(|| notes.join("; ")),
        exactness: Some(exactness),
        accuracy: None,
        deterministic: Some(deterministic),
        batch_invariant: None,
        integrity_failures: integrity,
        speed,
        gradients,
        ..cases::case_skeleton(spec, CaseStatus::Ran, None)
    })
}

/// The buffers of a backward call in the order the address cases place them.
const PLACED: [&str; 6] = ["dx", "dw", "ws", "dy", "x", "w"];

/// The address cases of a backward call (`address::plan` over its six buffers): at each
/// placement the gradients poisoned, the workspace poisoned, the inputs copied, one call of
/// `entries`; then the gradients must hold `want`'s bits (call 1's at fresh allocations), the
/// inputs theirs, and every guard region its bytes. Returns the integrity failures: one line
/// for gradients that depend on the address (the first placement that differed, how many
/// did), and up to `MAX_OTHER_LINES` for inputs modified or guards written at a placement.
fn placements(
    run: &CaseRun<'_>,
    entries: &[Entry],
    dev: DeviceShape,
    inputs: [(&HostTensor, &DevBuf); 3],
    out_bytes: [usize; 3],
    want: &Grads,
) -> Result<Vec<String>, ExecError> {
    let (gpu, spec) = (run.gpu, run.spec);
    let sizes = [
        out_bytes[0],
        out_bytes[1],
        out_bytes[2],
        inputs[0].1.bytes,
        inputs[1].1.bytes,
        inputs[2].1.bytes,
    ];
    let mut placed: Vec<DevBuf> = sizes
        .iter()
        .map(|&b| gpu.alloc_placed(b, PERIOD))
        .collect::<Result<_, _>>()?;
    let plan = address::plan(PLACED.len());
    let mut first: Option<(Placement, Vec<Difference>)> = None;
    let mut differing = 0usize;
    let mut other: Vec<String> = Vec::new();
    for p in &plan {
        for (i, (buf, &residue)) in placed.iter_mut().zip(&p.at).enumerate() {
            // the gradients and workspace poisoned, the inputs copied
            let source = i.checked_sub(3).map(|k| inputs[k].1);
            address::place(run, buf, residue, guard_byte(), source)?;
        }
        let ptrs = BackwardPtrs {
            dx: placed[0].ptr(),
            dw: placed[1].ptr(),
            ws: placed[2].ptr(),
            dy: placed[3].ptr(),
            x: placed[4].ptr(),
            w: placed[5].ptr(),
        };
        call(run, entries, ptrs, dev, None)?;
        let mut diffs = Vec::new();
        for (i, expected) in [(0, &want.0), (1, &want.1)] {
            if !run.holds(&placed[i], expected)? {
                let now = gpu.download_vec(&placed[i])?;
                diffs.extend(Difference::of(PLACED[i], spec.dtype, &now, expected));
            }
        }
        let at = address::describe(&PLACED, p);
        for (k, (host, _)) in inputs.iter().enumerate() {
            if !run.holds(&placed[3 + k], &host.bytes)? {
                other.push(format!(
                    "with {at}: input {} was modified by the kernel",
                    PLACED[3 + k]
                ));
            }
        }
        for (i, buf) in placed.iter().enumerate() {
            for g in gpu.check_guards(buf)? {
                other.push(format!("with {at}: {}: {g}", PLACED[i]));
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
            address::address_line(&PLACED, (p, d.as_slice()), differing, plan.len(), spec.cols)
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
