//! Compiles that run in the background (issue 29): every module of a kernel (one per dtype) and
//! the reference layers start on the first case, one thread each, and a case waits only for
//! the modules it launches (its dtype's entry and the reference layers), not for the others.
//! A verification's cases run dtype by dtype, the dtype whose module finished first first
//! (`Executor::first_ready`, which polls `Queue::is_finished`), so one dtype's cases run while
//! the other dtypes' modules are still compiling; before, every case waited for the slowest
//! module.
//!
//! `Queue` is the scheduling alone, generic over the key and what a job makes, so that it is
//! tested on the CPU; `cuda::Gpu` runs NVRTC through it and loads what it gets on its own
//! thread (a CUDA module is loaded where the context is current).

use std::collections::HashMap;
use std::hash::Hash;
use std::thread::JoinHandle;
use std::time::Instant;

/// One job's outcome, with its timing (for `KERNELIZE_TRACE`).
#[derive(Debug)]
pub struct Finished<T> {
    /// `Err`: the job's error, or that it panicked.
    pub result: Result<T, String>,
    /// Seconds the job ran.
    pub work_s: f64,
    /// Seconds from the job's start until it was taken (the job's time plus any wait before it
    /// was asked for).
    pub since_start_s: f64,
    /// Seconds the caller blocked waiting for it.
    pub waited_s: f64,
}

struct Running<T> {
    handle: JoinHandle<(Result<T, String>, f64)>,
    started: Instant,
}

/// Jobs running on threads of their own, by key; each is taken (joined) once.
pub struct Queue<K, T> {
    running: HashMap<K, Running<T>>,
}

impl<K, T> Default for Queue<K, T> {
    fn default() -> Self {
        Queue {
            running: HashMap::new(),
        }
    }
}

impl<K: Eq + Hash, T: Send + 'static> Queue<K, T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Start `work` on a thread of its own under `key`, unless a job of that key is running or
    /// finished and not yet taken (then nothing starts; `false`).
    pub fn start<F>(&mut self, key: K, work: F) -> bool
    where
        F: FnOnce() -> Result<T, String> + Send + 'static,
    {
        if self.running.contains_key(&key) {
            return false;
        }
        let handle = std::thread::spawn(move || {
            let t = Instant::now();
            let r = work();
            (r, t.elapsed().as_secs_f64())
        });
        self.running.insert(
            key,
            Running {
                handle,
                started: Instant::now(),
            },
        );
        true
    }

    /// Whether a job of `key` was started and not yet taken.
    pub fn contains(&self, key: &K) -> bool {
        self.running.contains_key(key)
    }

    /// Whether the job of `key` was started and has finished (its outcome waits to be taken).
    pub fn is_finished(&self, key: &K) -> bool {
        self.running
            .get(key)
            .is_some_and(|r| r.handle.is_finished())
    }

    /// How many jobs were started and not yet taken.
    pub fn len(&self) -> usize {
        self.running.len()
    }

    pub fn is_empty(&self) -> bool {
        self.running.is_empty()
    }

    /// Wait for the job of `key` alone (the others go on running) and take its outcome; `None`
    /// when no job of that key was started or it was taken already.
    pub fn take(&mut self, key: &K) -> Option<Finished<T>> {
        let r = self.running.remove(key)?;
        let t = Instant::now();
        let (result, work_s) = match r.handle.join() {
            Ok((result, s)) => (result, s),
            Err(_) => (Err("the job panicked".to_string()), 0.0),
        };
        Some(Finished {
            result,
            work_s,
            since_start_s: r.started.elapsed().as_secs_f64(),
            waited_s: t.elapsed().as_secs_f64(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn taking_one_job_does_not_wait_for_the_others() {
        let mut q: Queue<&str, u32> = Queue::new();
        // "slow" finishes only when the test lets it, after "fast" was taken.
        let (release, gate) = mpsc::channel::<()>();
        assert!(q.start("slow", move || {
            gate.recv_timeout(Duration::from_secs(30))
                .map_err(|e| e.to_string())?;
            Ok(2)
        }));
        assert!(q.start("fast", || Ok(1)));
        let fast = q.take(&"fast").expect("started");
        assert_eq!(fast.result, Ok(1));
        assert!(q.contains(&"slow") && !q.contains(&"fast"));
        assert_eq!(q.len(), 1);
        release.send(()).expect("slow waits");
        let slow = q.take(&"slow").expect("started");
        assert_eq!(slow.result, Ok(2));
        assert!(q.is_empty());
        assert!(q.take(&"slow").is_none(), "taken once");
    }

    #[test]
    fn a_key_runs_once_until_it_is_taken() {
        let mut q: Queue<u8, u8> = Queue::new();
        let (tx, rx) = mpsc::channel();
        let tx2 = tx.clone();
        assert!(q.start(1, move || {
            tx.send(()).ok();
            Ok(10)
        }));
        assert!(!q.start(1, move || {
            tx2.send(()).ok();
            Ok(20)
        }));
        assert_eq!(q.take(&1).expect("started").result, Ok(10));
        // The second closure never ran (it was dropped with its sender).
        assert_eq!(rx.try_iter().count(), 1);
        // Taken: the key may start again (a module is asked for again only when not loaded).
        assert!(q.start(1, || Ok(30)));
        assert_eq!(q.take(&1).expect("started").result, Ok(30));
    }

    /// `is_finished` says whether taking a job would wait, without taking it.
    #[test]
    fn a_job_is_finished_once_it_has_returned_and_until_it_is_taken() {
        let mut q: Queue<u8, u8> = Queue::new();
        let (release, gate) = mpsc::channel::<()>();
        q.start(1, move || {
            gate.recv_timeout(Duration::from_secs(30))
                .map_err(|e| e.to_string())?;
            Ok(1)
        });
        assert!(!q.is_finished(&1) && !q.is_finished(&2));
        release.send(()).expect("the job waits");
        let t0 = std::time::Instant::now();
        while !q.is_finished(&1) {
            assert!(t0.elapsed() < Duration::from_secs(30), "never finished");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(q.take(&1).expect("started").result, Ok(1));
        assert!(!q.is_finished(&1), "taken");
    }

    #[test]
    fn errors_and_panics_are_the_jobs_own_outcome() {
        let mut q: Queue<u8, u8> = Queue::new();
        q.start(1, || Err("log of 1".to_string()));
        q.start(2, || panic!("a bug"));
        q.start(3, || Ok(3));
        assert_eq!(
            q.take(&2).expect("started").result,
            Err("the job panicked".into())
        );
        assert_eq!(q.take(&1).expect("started").result, Err("log of 1".into()));
        assert_eq!(q.take(&3).expect("started").result, Ok(3));
    }

    /// A case waits for its dtype's module and its dtype's reference layers
    /// (`measure::compile_jobs`), and starts every module: each dtype's entry and reference layers.
    #[test]
    fn a_case_waits_for_its_own_dtypes_module_and_the_reference_layers() {
        use kernel_registry::manifest::entry_options;
        use kernel_registry::{DType, KernelBundle};
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels/layer_norm");
        let b = KernelBundle::load_dir(&dir).unwrap();
        let digest = b.digest().to_string();
        for &dt in DType::ALL {
            let reference = |d: DType| match d {
                DType::Bf16 => ("ref-bf16", "source"),
                DType::F16 => ("ref-f16", "source"),
                DType::F32 => ("ref-f32", "source"),
            };
            let (all, needed) = crate::measure::compile_jobs(&b, &digest, reference, dt);
            assert_eq!(
                all.len(),
                6,
                "three dtypes' entries and three dtypes' reference layers"
            );
            let mut macros: Vec<_> = all.iter().filter_map(|j| j.options.last()).collect();
            macros.sort();
            assert_eq!(macros.len(), 3);
            assert_eq!(needed.len(), 2, "{dt}");
            assert!(needed
                .iter()
                .any(|j| j.digest == reference(dt).0 && j.options.is_empty()));
            assert!(needed
                .iter()
                .any(|j| j.digest == digest
                    && j.options == entry_options(&b.manifest.nvrtc_options, dt)));
        }
    }

    /// Waiting per dtype helps because a run's cases come dtype by dtype: each dtype's cases are
    /// consecutive, except the large-index case at the end (in the narrowest dtype, whose module
    /// is loaded by then).
    #[test]
    fn the_suite_runs_dtype_by_dtype() {
        use kernel_registry::{DType, Op};
        for op in [Op::LayerNorm, Op::RmsNorm, Op::Silu, Op::SiluMul] {
            for quick in [false, true] {
                let specs =
                    crate::cases::suite(op, op.default_semantics(), DType::ALL, quick, 7, &[]);
                let order: Vec<DType> = specs
                    .iter()
                    .filter(|s| !s.large_index)
                    .map(|s| s.dtype)
                    .collect();
                let mut runs = order.clone();
                runs.dedup();
                assert_eq!(runs, DType::ALL.to_vec(), "{op} quick={quick}");
            }
        }
    }

    #[test]
    fn jobs_run_at_once_and_timing_is_reported() {
        let mut q: Queue<u8, ()> = Queue::new();
        let t = Instant::now();
        for k in 0..4 {
            q.start(k, || {
                std::thread::sleep(Duration::from_millis(200));
                Ok(())
            });
        }
        let outs: Vec<_> = (0..4).map(|k| q.take(&k).expect("started")).collect();
        // In parallel: four 200 ms jobs take far less than 800 ms.
        assert!(
            t.elapsed() < Duration::from_millis(700),
            "{:?}",
            t.elapsed()
        );
        for f in &outs {
            assert!(
                f.work_s >= 0.19 && f.since_start_s >= f.work_s - 0.01,
                "{f:?}"
            );
        }
        // The first take blocked; the later ones found their jobs done or nearly.
        assert!(outs[0].waited_s >= 0.1, "{:?}", outs[0]);
    }
}
