//! One case, as a sequence of named measurements (docs/spec.md section 3): the candidate's launches
//! (outputs poisoned afresh each time), then the reference (after the candidate, so its output
//! never lives on the device while the candidate runs), then integrity, determinism, exactness,
//! accuracy, batch invariance, address placements and speed, each in its own module. Runs in
//! the sandbox child.

pub mod address;
pub mod backward;
pub mod batch;
pub mod determinism;
pub mod gradients;
pub mod integrity;
pub mod large;
pub mod poison;
pub mod speed;

use crate::abi::{abi_args, reference_dims, reference_symbol, Bufs, Ptrs};
use crate::cases::CaseSpec;
use crate::cuda::{guard_byte, Arg, CompileJob, DevBuf, Gpu};
use crate::exec::{ExecError, Limits};
use crate::numeric::{compare, keyed_sum, worst};
use crate::oracle;
use cudarc::driver::sys::CUfunction;
use kernel_registry::manifest::{entry_options, LaunchDims};
use kernel_registry::report::{CaseReport, CaseStatus};
use kernel_registry::{KernelBundle, Op};
use poison::Poison;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Arc;

/// A kernel ready to launch: function, and how its dims are found.
pub(crate) struct Kern<'a> {
    pub name: String,
    pub f: CUfunction,
    pub dims: Box<dyn Fn(u64, u64) -> Result<LaunchDims, String> + 'a>,
}

/// The verifier's own GPU utilities (reference.cu's `kz_*` entries).
pub(crate) struct Tools {
    pub keyed_sum: CUfunction,
    pub keyed_sums: CUfunction,
    pub fill: CUfunction,
    pub place: CUfunction,
    pub gather: CUfunction,
    pub rows_differ: CUfunction,
    pub gen: CUfunction,
    pub mismatch: CUfunction,
    /// The key of the module they and the op's reference entries are in (`crate::ref_module`).
    pub reference: String,
}

/// Everything one case's measurements share.
pub(crate) struct CaseRun<'a> {
    pub gpu: &'a Gpu,
    pub spec: &'a CaseSpec,
    pub limits: &'a Limits,
    pub cand: Kern<'a>,
    pub refk: Kern<'a>,
    pub tools: Tools,
    pub bufs: Bufs,
    sum_buf: DevBuf,
}

/// The candidate's outputs after each of its three verification launches.
pub(crate) struct Launches {
    pub outs: Vec<Arc<Vec<u8>>>,
    pub ress: Vec<Arc<Vec<u8>>>,
    /// Launch 1's poison (launch 2 ran on its inverse).
    pub poison: Poison,
}

impl<'a> CaseRun<'a> {
    /// Row length of `x` (silu_and_mul's x holds gate and up; a gated op's `up` is a tensor
    /// of its own, `cols` long like the gate).
    pub fn x_row_len(&self) -> u64 {
        if self.spec.op == Op::SiluAndMul {
            2 * self.spec.cols
        } else {
            self.spec.cols
        }
    }

    /// The tensors of a launch on buffers (`x` default: the case's x).
    pub fn ptrs(&self, out: &DevBuf, res: Option<&DevBuf>, x: Option<&DevBuf>) -> Ptrs {
        Ptrs {
            x: x.unwrap_or(&self.bufs.x).ptr(),
            ..self.bufs.ptrs(out, res)
        }
    }

    /// Launch `k` on `rows` rows of `x` (default: the case's x) into `out`, and wait for the
    /// whole context to be idle.
    pub fn launch(
        &self,
        k: &Kern<'_>,
        out: &DevBuf,
        res: Option<&DevBuf>,
        x: Option<&DevBuf>,
        rows: u64,
    ) -> Result<(), ExecError> {
        self.launch_at(k, self.ptrs(out, res, x), rows)
    }

    /// Launch `k` on `rows` rows at the given addresses, and wait for the context to be idle.
    pub fn launch_at(&self, k: &Kern<'_>, t: Ptrs, rows: u64) -> Result<(), ExecError> {
        self.launch_at_queued(k, t, rows)?;
        self.wait_queued(&k.name, 1)
    }

    /// [`CaseRun::launch_at`] without the wait: queued behind what is already on the stream.
    /// [`CaseRun::wait_queued`] must follow before anything it wrote is read.
    pub fn launch_at_queued(&self, k: &Kern<'_>, t: Ptrs, rows: u64) -> Result<(), ExecError> {
        let d = (k.dims)(rows, self.spec.cols).map_err(|e| ExecError::Launch {
            what: format!("launch rule of {}", k.name),
            message: e,
        })?;
        let args = abi_args(self.spec, t, rows);
        self.gpu
            .launch_queued(&k.name, k.f, d.grid, d.block, d.shared_mem_bytes, &args)
    }

    /// Wait for `launches` queued launches of the candidate (`what`: the entry's name; each
    /// launch allowed the launch limit) and everything queued with them.
    pub fn wait_queued(&self, what: &str, launches: usize) -> Result<(), ExecError> {
        let limit = self.limits.launch() * launches.max(1) as u32;
        self.gpu.wait_queued(what, limit)
    }

    /// Poison `out` with `p` and launch the candidate into it.
    pub fn launch_candidate_poisoned(
        &self,
        p: Poison,
        out: &DevBuf,
        res: Option<&DevBuf>,
        x: Option<&DevBuf>,
        rows: u64,
    ) -> Result<(), ExecError> {
        self.gpu
            .fill_pattern(self.tools.fill, out, p.key, p.invert)?;
        self.launch(&self.cand, out, res, x, rows)
    }

    /// Poison `out` afresh and launch the candidate into it.
    pub fn poison_and_launch_candidate(
        &self,
        out: &DevBuf,
        res: Option<&DevBuf>,
        x: Option<&DevBuf>,
        rows: u64,
    ) -> Result<(), ExecError> {
        self.launch_candidate_poisoned(Poison::fresh(), out, res, x, rows)
    }

    /// The keyed sum of a device buffer's words, computed on the GPU (the verifier's own kernel,
    /// queued behind the candidate's launches already waited for; the download waits for it).
    fn device_sum(&self, dev: &DevBuf, key: u64) -> Result<u64, ExecError> {
        self.gpu.fill_queued(&self.sum_buf, 0)?;
        let words = dev.bytes.div_ceil(4) as u64;
        self.enqueue_sum(dev.ptr(), words, key, self.sum_buf.ptr())?;
        let mut c = [0u8; 8];
        self.gpu.download(&self.sum_buf, &mut c)?;
        Ok(u64::from_le_bytes(c))
    }

    /// Queue the keyed sum of the `words` 32-bit words at `at` (4-byte aligned), added into the
    /// u64 at `into` (no wait: read it after the next synchronisation).
    pub fn enqueue_sum(&self, at: u64, words: u64, key: u64, into: u64) -> Result<(), ExecError> {
        self.gpu.enqueue(
            "keyed sum on the GPU",
            self.tools.keyed_sum,
            [sum_blocks(words, self.gpu), 1, 1],
            [256, 1, 1],
            &[
                Arg::Ptr(at),
                Arg::I64(words as i64),
                Arg::U64(key),
                Arg::Ptr(into),
            ],
        )
    }

    /// Whether a device buffer still holds `host`'s bytes, decided on the GPU: a keyed sum of
    /// its words against the same sum of the host copy, the key drawn afresh for every check,
    /// after the candidate's launches, so a kernel cannot forge it. The last word may reach up
    /// to 3 bytes into the guard (padded with the guard byte on the host; a kernel that wrote
    /// there is reported by the guard check).
    pub fn holds(&self, dev: &DevBuf, host: &[u8]) -> Result<bool, ExecError> {
        self.still_holds(dev, &self.expect(host))
    }

    /// An expectation of a buffer's bits for repeated checks on the GPU ([`Self::still_holds`]):
    /// one key drawn now (after the candidate's launches that made `host`) and the host's sum
    /// once, where [`Self::holds`] hashes the host copy again at every check.
    pub fn expect(&self, host: &[u8]) -> Held {
        self.expect_all(&[host]).remove(0)
    }

    /// [`Self::expect`] of each of `hosts`, all with one key (`address::PlacedSums::sharing`
    /// checks placed buffers with it, without hashing the host copies again).
    pub fn expect_all(&self, hosts: &[&[u8]]) -> Vec<Held> {
        let key = RandomState::new().hash_one(hosts.as_ptr());
        hosts
            .iter()
            .map(|h| Held {
                key,
                sum: keyed_sum(h, key, guard_byte()),
                bytes: h.len(),
            })
            .collect()
    }

    /// Whether `dev` holds the bits `h` was made from, decided on the GPU.
    pub fn still_holds(&self, dev: &DevBuf, h: &Held) -> Result<bool, ExecError> {
        assert_eq!(dev.bytes, h.bytes);
        Ok(self.device_sum(dev, h.key)? == h.sum)
    }

    /// Queue dst row j := src row idx[j] on the GPU (no wait: ordered before later launches).
    pub fn gather(
        &self,
        dst: u64,
        src: &DevBuf,
        idx: u64,
        n: u64,
        row_bytes: u64,
    ) -> Result<(), ExecError> {
        let blocks = (n * row_bytes).div_ceil(256).clamp(1, 1 << 16) as u32;
        self.gpu.enqueue(
            "gathering a batch composition",
            self.tools.gather,
            [blocks, 1, 1],
            [256, 1, 1],
            &[
                Arg::Ptr(dst),
                Arg::Ptr(src.ptr()),
                Arg::Ptr(idx),
                Arg::I64(n as i64),
                Arg::I64(row_bytes as i64),
            ],
        )
    }

    /// Launches 1, 2, 3 of the candidate on the case's inputs (launch 2's poison is launch 1's
    /// inverted; launch 3's is fresh). Launch 1's outputs are downloaded; a later launch whose
    /// outputs still hold launch 1's bits (`holds`) shares that host copy.
    fn candidate_launches(
        &self,
        out: &DevBuf,
        res: Option<&DevBuf>,
    ) -> Result<Launches, ExecError> {
        let p1 = Poison::fresh();
        let poisons = [p1, p1.inverted(), Poison::fresh()];
        let mut outs: Vec<Arc<Vec<u8>>> = Vec::new();
        let mut ress: Vec<Arc<Vec<u8>>> = Vec::new();
        // launch 1's bits as launches 2 and 3 are checked against them: each output hashed on
        // the host once, with a key of its own drawn after launch 2 (a backward case's calls
        // share one key with the inputs, `backward::run_case`; the forward's integrity and
        // address checks still draw their own)
        let mut held: [Option<Held>; 2] = [None, None];
        for (k, &p) in poisons.iter().enumerate() {
            if let (Some(r), Some(pr)) = (res, &self.bufs.residual) {
                self.gpu.copy(r, pr)?;
            }
            self.launch_candidate_poisoned(p, out, res, None, self.spec.rows)?;
            let pairs = std::iter::once((out, &mut outs)).chain(res.map(|r| (r, &mut ress)));
            for ((now, host), h) in pairs.zip(&mut held) {
                let same = k > 0 && {
                    let h = h.get_or_insert_with(|| self.expect(&host[0]));
                    self.still_holds(now, h)?
                };
                let copy = if same {
                    Arc::clone(&host[0])
                } else {
                    Arc::new(self.gpu.download_vec(now)?)
                };
                host.push(copy);
            }
        }
        Ok(Launches {
            outs,
            ress,
            poison: p1,
        })
    }

    /// The reference's outputs on the case's inputs (residual from its pristine copy). Its
    /// device buffers are poisoned before they are freed, so no later launch finds them.
    fn reference(&self) -> Result<(Vec<u8>, Option<Vec<u8>>), ExecError> {
        let gpu = self.gpu;
        let out = gpu.alloc(self.out_bytes())?;
        let res = match &self.bufs.residual {
            Some(pr) => {
                let r = gpu.alloc(pr.bytes)?;
                gpu.copy(&r, pr)?;
                Some(r)
            }
            None => None,
        };
        self.launch(&self.refk, &out, res.as_ref(), None, self.spec.rows)?;
        let host = gpu.download_vec(&out)?;
        let res_host = res.as_ref().map(|r| gpu.download_vec(r)).transpose()?;
        for b in std::iter::once(&out).chain(res.as_ref()) {
            gpu.fill_pattern(self.tools.fill, b, Poison::fresh().key, false)?;
        }
        Ok((host, res_host))
    }

    pub fn out_bytes(&self) -> usize {
        (self.spec.rows * self.spec.cols) as usize * self.spec.dtype.size_bytes()
    }

    /// Median of `reps` timed candidate launches; the index of each whose output (or updated
    /// residual) differs from the verified one goes to `bad`.
    pub fn time_candidate(
        &self,
        reps: usize,
        expected_out: &[u8],
        expected_res: Option<&[u8]>,
        bad: &mut Vec<usize>,
    ) -> Result<f64, ExecError> {
        let gpu = self.gpu;
        let out = gpu.alloc(self.out_bytes())?;
        let res = match &self.bufs.residual {
            Some(pr) => Some(gpu.alloc(pr.bytes)?),
            None => None,
        };
        let (d, args) = self.timed_args(&self.cand, &out, res.as_ref())?;
        // One key for all checks of this measurement, drawn now; the host sums once.
        let want_out = self.expect(expected_out);
        let want_res = expected_res.map(|r| self.expect(r));
        let mut prepare = || -> Result<(), ExecError> {
            let p = Poison::fresh();
            gpu.fill_pattern(self.tools.fill, &out, p.key, p.invert)?;
            if let (Some(r), Some(pr)) = (&res, &self.bufs.residual) {
                gpu.copy(r, pr)?;
            }
            Ok(())
        };
        let mut check = |rep: usize| -> Result<(), ExecError> {
            gpu.wait_idle(&self.cand.name)?;
            let mut ok = self.still_holds(&out, &want_out)?;
            if let (Some(r), Some(w)) = (&res, &want_res) {
                ok &= self.still_holds(r, w)?;
            }
            if !ok {
                bad.push(rep);
            }
            Ok(())
        };
        gpu.time_launches(
            &self.cand.name,
            self.cand.f,
            d.grid,
            d.block,
            d.shared_mem_bytes,
            &args,
            crate::cuda::Reps::all(reps),
            self.limits.launch(),
            &mut prepare,
            &mut check,
        )
    }

    /// Median of `reps` timed reference launches (into a buffer of its own, poisoned after).
    pub fn time_reference(&self, reps: usize) -> Result<f64, ExecError> {
        let gpu = self.gpu;
        let out = gpu.alloc(self.out_bytes())?;
        let res = match &self.bufs.residual {
            Some(pr) => Some(gpu.alloc(pr.bytes)?),
            None => None,
        };
        let (d, args) = self.timed_args(&self.refk, &out, res.as_ref())?;
        let mut prepare = || -> Result<(), ExecError> {
            if let (Some(r), Some(pr)) = (&res, &self.bufs.residual) {
                gpu.copy(r, pr)?;
            }
            Ok(())
        };
        let t = gpu.time_launches(
            "reference",
            self.refk.f,
            d.grid,
            d.block,
            d.shared_mem_bytes,
            &args,
            crate::cuda::Reps::reference(reps),
            self.limits.launch(),
            &mut prepare,
            &mut |_| Ok(()),
        )?;
        for b in std::iter::once(&out).chain(res.as_ref()) {
            gpu.fill_pattern(self.tools.fill, b, Poison::fresh().key, false)?;
        }
        Ok(t)
    }

    fn timed_args(
        &self,
        k: &Kern<'_>,
        out: &DevBuf,
        res: Option<&DevBuf>,
    ) -> Result<(LaunchDims, Vec<Arg>), ExecError> {
        let d = (k.dims)(self.spec.rows, self.spec.cols).map_err(|e| ExecError::Launch {
            what: k.name.clone(),
            message: e,
        })?;
        Ok((
            d,
            abi_args(self.spec, self.ptrs(out, res, None), self.spec.rows),
        ))
    }
}

/// Blocks of a keyed sum over `words` words.
pub(crate) fn sum_blocks(words: u64, gpu: &Gpu) -> u32 {
    words.div_ceil(256).clamp(1, 8 * gpu.info.sm_count as u64) as u32
}

/// Compile (cached per process) and look up everything a case launches.
fn load<'a>(
    gpu: &'a mut Gpu,
    bundle: &'a KernelBundle,
    spec: &CaseSpec,
) -> Result<(&'a Gpu, CUfunction, CUfunction, Tools), ExecError> {
    let m = &bundle.manifest;
    let dt = spec.dtype;
    let sym = m.entries.get(&dt).ok_or_else(|| ExecError::Compile {
        what: m.name.clone(),
        log: format!("no entry for {dt} in kernel.toml [entry]"),
    })?;
    let tools = compile_with_tools(gpu, bundle, dt)?;
    let digest = bundle.digest().to_string();
    let cand = gpu.function(&digest, &entry_options(&m.nvrtc_options, dt), sym)?;
    let refk = gpu.function(
        &tools.reference,
        &[],
        &reference_symbol(spec.op, spec.semantics, dt),
    )?;
    Ok((&*gpu, cand, refk, tools))
}

/// The reference layers' module of `bundle`'s op for `dt` (`crate::ref_module::module`): its key
/// and source.
pub(crate) fn reference_module(
    bundle: &KernelBundle,
    dt: kernel_registry::DType,
) -> (&'static str, &'static str) {
    crate::ref_module::module(bundle.manifest.op, bundle.manifest.semantics, dt)
}

/// Every module of `bundle` (each dtype's entry, and each dtype's reference layers: `reference`
/// gives a dtype's module key and source), and of them the two a case of `dt` launches: its
/// dtype's entry and its dtype's reference layers.
pub(crate) fn compile_jobs<'a>(
    bundle: &'a KernelBundle,
    digest: &'a str,
    reference: impl Fn(kernel_registry::DType) -> (&'a str, &'a str),
    dt: kernel_registry::DType,
) -> (Vec<CompileJob<'a>>, Vec<CompileJob<'a>>) {
    let mut all = crate::abi::entry_jobs(bundle, digest);
    for &d in kernel_registry::DType::ALL {
        if bundle.manifest.entries.contains_key(&d) {
            let (key, source) = reference(d);
            all.push(CompileJob {
                digest: key,
                what: format!("reference layers ({d})"),
                source,
                options: Vec::new(),
            });
        }
    }
    let own = entry_options(&bundle.manifest.nvrtc_options, dt);
    let own_reference = reference(dt).0;
    let needed = all
        .iter()
        .filter(|j| {
            (j.digest == own_reference && j.options.is_empty())
                || (j.digest == digest && j.options == own)
        })
        .cloned()
        .collect();
    (all, needed)
}

/// Compile the bundle's modules and the reference layers of its op (cached per process; the
/// other ops' reference entries and the other dtypes' left out, `crate::ref_module`), and look
/// up the verifier's own utilities for `dt`. Every dtype's entry is its own module (the author's
/// options plus the dtype macro, as the clients compile it); on the first case all of them and
/// the reference layers start compiling at once, in parallel, and a case waits only for its
/// own dtype's module and the reference layers (`crate::compile_queue`), so the first dtype's
/// cases run while the others compile. Compile time is traced by `Gpu::compile_all`.
fn compile_with_tools(
    gpu: &mut Gpu,
    bundle: &KernelBundle,
    dt: kernel_registry::DType,
) -> Result<Tools, ExecError> {
    let digest = bundle.digest().to_string();
    let (all, needed) = compile_jobs(bundle, &digest, |d| reference_module(bundle, d), dt);
    let rd = reference_module(bundle, dt).0;
    gpu.start_compiles(&all);
    gpu.compile_all(&needed)?;
    let mut tool = |name: &str| gpu.function(rd, &[], name);
    Ok(Tools {
        keyed_sum: tool("kz_keyed_sum_u32")?,
        keyed_sums: tool("kz_keyed_sums")?,
        fill: tool("kz_fill_pattern")?,
        place: tool("kz_place")?,
        gather: tool("kz_gather_rows")?,
        rows_differ: tool("kz_rows_differ")?,
        gen: tool(&format!("kz_gen_{dt}"))?,
        mismatch: tool(&format!("kz_mismatch_{dt}"))?,
        reference: rd.to_string(),
    })
}

/// What a buffer must hold, for checks on the GPU (`CaseRun::expect`).
pub(crate) struct Held {
    pub(crate) key: u64,
    pub(crate) sum: u64,
    bytes: usize,
}

/// A case's phases for `KERNELIZE_TRACE` (`bench/trace_phases.py` sums them over a run): each
/// mark traces the seconds since the previous one as `<case id> <phase>: <s> s`.
pub(crate) struct Phases<'a> {
    id: &'a str,
    last: std::time::Instant,
}

impl<'a> Phases<'a> {
    pub(crate) fn start(id: &'a str) -> Self {
        Phases {
            id,
            last: std::time::Instant::now(),
        }
    }

    pub(crate) fn mark(&mut self, name: &str) {
        let now = std::time::Instant::now();
        let secs = (now - self.last).as_secs_f64();
        crate::trace(|| format!("{} {name}: {secs:.3} s", self.id));
        self.last = now;
    }
}

/// Run one case of `bundle` and measure it.
pub(crate) fn run_case(
    gpu: &mut Gpu,
    bundle: &KernelBundle,
    spec: &CaseSpec,
    limits: &Limits,
    copy_gbps: f64,
) -> Result<CaseReport, ExecError> {
    if spec.op.is_backward() {
        return backward::run_case(gpu, bundle, spec, limits, copy_gbps);
    }
    let m = &bundle.manifest;
    let (op, dt) = (spec.op, spec.dtype);
    let sym = m.entries.get(&dt).cloned().unwrap_or_default();
    let sm_count = gpu.info.sm_count;
    let (gpu, cand_f, ref_f, tools) = load(gpu, bundle, spec)?;
    let cand = Kern {
        name: format!("{} ({sym})", m.name),
        f: cand_f,
        dims: Box::new(move |r, c| m.launch_dims(r, c, sm_count)),
    };
    let refk = Kern {
        name: "reference".into(),
        f: ref_f,
        dims: Box::new(move |r, c| Ok(reference_dims(op, r, c))),
    };
    let mut phases = Phases::start(&spec.id);
    let skeleton = crate::cases::case_skeleton(spec, CaseStatus::Ran, None);
    if spec.large_index {
        return large::run(gpu, spec, limits, cand, refk, tools, skeleton);
    }

    let drawn = crate::ahead::take(spec);
    let (inp, truth) = (
        drawn.inputs,
        drawn.truths.and_then(|t| t.into_iter().next()),
    );
    phases.mark(if drawn.ahead {
        "generate (ahead)"
    } else {
        "generate"
    });
    let run = CaseRun {
        gpu,
        spec,
        limits,
        cand,
        refk,
        tools,
        bufs: Bufs::upload(gpu, &inp)?,
        sum_buf: gpu.alloc(8)?,
    };
    let out = gpu.alloc(run.out_bytes())?;
    let res = match &run.bufs.residual {
        Some(pr) => Some(gpu.alloc(pr.bytes)?),
        None => None,
    };

    // 1. The candidate, three times, before the reference has run.
    let launches = run.candidate_launches(&out, res.as_ref())?;
    phases.mark("3 candidate launches");
    // 2. The reference, after it.
    let (ref_host, ref_res_host) = run.reference()?;
    phases.mark("reference");
    // 3. Integrity: every element written, nothing outside the buffers, inputs unchanged.
    let mut integrity = integrity::check(&run, &inp, &launches, &out, res.as_ref())?;
    phases.mark("integrity");
    // 4. Determinism.
    let all: Vec<Vec<&[u8]>> = (0..launches.outs.len())
        .map(|k| {
            std::iter::once(launches.outs[k].as_slice())
                .chain(launches.ress.get(k).map(|r| r.as_slice()))
                .collect()
        })
        .collect();
    // Launches whose outputs shared launch 1's host copy (same bits, checked on the GPU) differ
    // in nothing; only the others are compared element by element.
    let same = |v: &[Arc<Vec<u8>>]| v.iter().all(|o| Arc::ptr_eq(o, &v[0]));
    let differing = if same(&launches.outs) && same(&launches.ress) {
        0
    } else {
        determinism::max_differing(dt, &all)
    };
    let deterministic = differing == 0;
    let mut notes: Vec<String> = determinism::note(differing).into_iter().collect();
    // 5. Exactness: the worst launch against the reference.
    let exact_of = |k: usize| {
        let mut pairs: Vec<(&[u8], &[u8])> = vec![(&launches.outs[k], &ref_host)];
        if let (Some(r), Some(rr)) = (launches.ress.get(k), &ref_res_host) {
            pairs.push((r, rr));
        }
        compare(dt, &pairs)
    };
    let mut exactness = exact_of(0);
    if !deterministic {
        for k in 1..launches.outs.len() {
            exactness = worst(exactness, exact_of(k));
        }
    }
    phases.mark("determinism+exactness");
    // 6. Accuracy against the f64 oracle.
    let accuracy = oracle::accuracy(spec, &inp, &launches.outs[0], &ref_host, truth.as_ref());
    phases.mark("oracle");
    // 7. Batch invariance: every row, in other compositions, against launch 1 (its device copy).
    // When deterministic, `out` (and `res`) still hold launch 1's bits: no copy is needed.
    let batch_invariant = if spec.check_batch {
        let upload = |host: &[u8]| -> Result<DevBuf, ExecError> {
            let b = gpu.alloc(host.len())?;
            gpu.upload(&b, host)?;
            Ok(b)
        };
        let (copy, copy_res) = if deterministic {
            (None, None)
        } else {
            (
                Some(upload(&launches.outs[0])?),
                launches.ress.first().map(|r| upload(r)).transpose()?,
            )
        };
        let base = copy.as_ref().unwrap_or(&out);
        let base_res = copy_res.as_ref().or(res.as_ref());
        let differ = batch::check(&run, base, base_res)?;
        let ok = differ.is_none();
        notes.extend(differ);
        Some(ok)
    } else {
        None
    };
    phases.mark("batch invariance");
    // 8. Address cases: the candidate again with every tensor at other addresses the ABI
    // allows, the same bits required (a non-deterministic kernel's placed launches count in its
    // exactness instead).
    let placed = address::check(
        &run,
        &inp,
        &launches,
        (&ref_host, ref_res_host.as_deref()),
        deterministic,
    )?;
    integrity.extend(placed.failures);
    notes.extend(placed.note);
    if let Some(e) = placed.exactness {
        exactness = worst(exactness, e);
    }
    phases.mark("address placements");
    // 9. Speed, every timed launch checked.
    let speed = if spec.measure_speed {
        let timed = speed::measure(
            &run,
            &launches.outs[0],
            launches.ress.first().map(|r| r.as_slice()),
            copy_gbps,
        )?;
        integrity.extend(timed.failures);
        Some(timed.speed)
    } else {
        None
    };
    phases.mark("speed");
    Ok(CaseReport {
        note: (!notes.is_empty()).then(|| notes.join("; ")),
        exactness: Some(exactness),
        accuracy: Some(accuracy),
        deterministic: Some(deterministic),
        batch_invariant,
        integrity_failures: integrity,
        speed,
        ..skeleton
    })
}
