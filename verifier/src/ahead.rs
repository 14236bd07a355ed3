//! A case's host work done ahead of it: while one case runs (mostly waiting for the GPU), the
//! next case's inputs are drawn on a thread of their own, and the f64 oracle's truth of its
//! output (a forward op) or of its gradients (a backward op) computed from them (seconds each
//! for the largest backward shapes).
//! `crate::verify` names the next case (`Executor::prefetch`), the process that runs it starts
//! the work ([`prefetch`]) and the case takes it ([`take`]). A hint only: a case whose work was
//! not started ahead does it on the spot, with the same result. `KERNELIZE_AHEAD=0` turns it
//! off (a host short of memory: up to two more cases' inputs are held, about 1 GB each at the
//! suite's largest f32 shapes). The largest cases' work also starts with the verification, while
//! the modules compile ([`prefetch_early`], up to 8 GiB); `KERNELIZE_AHEAD_EARLY=0` turns that
//! alone off.

use crate::cases::{generate, CaseInputs, CaseSpec};
use crate::oracle::{self, Truth};
use std::sync::Mutex;
use std::thread::JoinHandle;

/// A case's inputs, and the oracle's truths ([`oracle::truths`]: a forward op's output, a
/// backward op's gradients in [`kernel_registry::Op::gradients`] order) where they were
/// computed ahead.
pub struct Drawn {
    pub inputs: CaseInputs,
    pub truths: Option<Vec<Truth>>,
    /// Whether this came from [`prefetch`]'s thread (else it was drawn on the spot).
    pub ahead: bool,
}

/// Cases whose work has started ahead, oldest first. The case running now may still be here
/// when the next one's work starts (the sandbox's child starts the next case's work, then runs
/// its own case; the in-process executor likewise), so two are kept.
const KEPT: usize = 2;
type Pending = Vec<(CaseSpec, JoinHandle<Drawn>)>;
static AHEAD: Mutex<Pending> = Mutex::new(Vec::new());

/// A case named by [`prefetch_early`]: its thread draws it when its turn comes, unless the case
/// was taken before that (then it is drawn on the spot, and the thread skips it).
struct Early {
    spec: CaseSpec,
    /// [`WAITING`], [`DRAWING`] (its thread has it) or [`TAKEN`] (taken before its turn).
    state: std::sync::Arc<std::sync::atomic::AtomicU8>,
    handle: JoinHandle<Option<Drawn>>,
}
const WAITING: u8 = 0;
const DRAWING: u8 = 1;
const TAKEN: u8 = 2;

/// The large cases named by [`prefetch_early`], kept until taken (no [`KEPT`] bound: the
/// caller bounds them, `verify::early_cases`).
static EARLY: Mutex<Vec<Early>> = Mutex::new(Vec::new());

fn draw(s: &CaseSpec) -> Drawn {
    let inputs = generate(s);
    let truths = Some(oracle::truths(s, &inputs));
    Drawn {
        inputs,
        truths,
        ahead: true,
    }
}

/// Start `spec`'s host work on a thread of its own, for the case that asks for it ([`take`]).
/// At most [`KEPT`] cases ahead (an older one not taken is dropped: its thread finishes on its
/// own); the large-index cases draw their data on the GPU. A case whose work started early
/// ([`prefetch_early`]) is not started again.
pub fn prefetch(spec: &CaseSpec) {
    if spec.large_index || !enabled(std::env::var_os("KERNELIZE_AHEAD").as_deref()) {
        return;
    }
    if EARLY
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .any(|e| &e.spec == spec)
    {
        return;
    }
    let s = spec.clone();
    let handle = std::thread::spawn(move || draw(&s));
    let mut pending = AHEAD.lock().unwrap_or_else(|e| e.into_inner());
    pending.push((spec.clone(), handle));
    if pending.len() > KEPT {
        pending.remove(0);
    }
}

/// Start the host work of `specs` (a verification's largest cases, whose inputs and f64 truths
/// take the host tenths of a second each) at the start of a verification, while the modules
/// compile: one case after another, on a thread pool of half the host's cores, so that NVRTC
/// keeps the other half. Each is kept until its case takes it ([`take`]).
pub fn prefetch_early(specs: &[CaseSpec]) {
    let specs: Vec<CaseSpec> = specs.iter().filter(|s| !s.large_index).cloned().collect();
    let on = |v: &str| enabled(std::env::var_os(v).as_deref());
    if specs.is_empty() || !on("KERNELIZE_AHEAD") || !on("KERNELIZE_AHEAD_EARLY") {
        return;
    }
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()) / 2;
    let pool = match rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .build()
    {
        Ok(p) => std::sync::Arc::new(p),
        Err(_) => return,
    };
    // One thread per case (each handle taken on its own), drawing in turn: case i waits until
    // cases 0..i are drawn or skipped, so that the suite's first large case is ready first; a
    // case taken before its turn is drawn on the spot instead ([`take`]).
    use std::sync::atomic::{AtomicU8, Ordering};
    let turn = std::sync::Arc::new((Mutex::new(0usize), std::sync::Condvar::new()));
    let mut early = EARLY.lock().unwrap_or_else(|e| e.into_inner());
    // What an earlier verification named and never took (it stopped early) is let go: a case
    // not started is skipped, one being drawn is dropped when done.
    for stale in early.drain(..) {
        stale.state.store(TAKEN, Ordering::Release);
    }
    for (i, s) in specs.into_iter().enumerate() {
        let state = std::sync::Arc::new(AtomicU8::new(WAITING));
        let (pool, turn, spec, st) = (pool.clone(), turn.clone(), s.clone(), state.clone());
        let handle = std::thread::spawn(move || {
            // the next case's turn comes when this one is done, skipped, or panicked
            struct Advance<'a>(&'a (Mutex<usize>, std::sync::Condvar));
            impl Drop for Advance<'_> {
                fn drop(&mut self) {
                    *self.0 .0.lock().unwrap_or_else(|e| e.into_inner()) += 1;
                    self.0 .1.notify_all();
                }
            }
            let (next, cv) = &*turn;
            let mut n = next.lock().unwrap_or_else(|e| e.into_inner());
            while *n != i {
                n = cv.wait(n).unwrap_or_else(|e| e.into_inner());
            }
            drop(n);
            let _advance = Advance(&turn);
            st.compare_exchange(WAITING, DRAWING, Ordering::AcqRel, Ordering::Acquire)
                .ok()
                .map(|_| pool.install(|| draw(&spec)))
        });
        early.push(Early {
            spec: s,
            state,
            handle,
        });
    }
}

/// Whether work is done ahead, given `KERNELIZE_AHEAD`'s value: unless it is `0`.
fn enabled(setting: Option<&std::ffi::OsStr>) -> bool {
    setting.is_none_or(|v| v != "0")
}

/// `spec`'s inputs (and their truths) as [`prefetch`] made them, else its inputs drawn
/// now (`truths` then `None`: the verdict computes them). The same bytes either way
/// ([`generate`] and the oracle are functions of the spec).
pub fn take(spec: &CaseSpec) -> Drawn {
    let early = {
        let mut early = EARLY.lock().unwrap_or_else(|e| e.into_inner());
        let at = early.iter().position(|e| &e.spec == spec);
        at.map(|i| early.remove(i))
    };
    if let Some(e) = early {
        use std::sync::atomic::Ordering;
        // Not its turn yet: drawn here, now, and its thread skips it. Else its thread has it.
        let mine = e
            .state
            .compare_exchange(WAITING, TAKEN, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if !mine {
            if let Ok(Some(d)) = e.handle.join() {
                return d;
            }
        }
        return Drawn {
            inputs: generate(spec),
            truths: None,
            ahead: false,
        };
    }
    let handle = {
        let mut pending = AHEAD.lock().unwrap_or_else(|e| e.into_inner());
        let at = pending.iter().position(|(s, _)| s == spec);
        at.map(|i| pending.remove(i).1)
    };
    let now = || Drawn {
        inputs: generate(spec),
        truths: None,
        ahead: false,
    };
    match handle {
        Some(h) => h.join().unwrap_or_else(|_| now()),
        None => now(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernel_registry::{DType, Op, Semantics};

    /// A case's inputs are the same bytes whether [`prefetch`] drew them ahead or [`take`] draws
    /// them on the spot, a backward case's truths computed ahead are the oracle's, and the
    /// work started for a case is still there when the next case's has started too (as the
    /// sandbox's child does it).
    #[test]
    fn kernelize_ahead_0_turns_it_off() {
        use std::ffi::OsStr;
        assert!(enabled(None));
        assert!(enabled(Some(OsStr::new("1"))));
        assert!(!enabled(Some(OsStr::new("0"))));
    }

    /// Cases named early are drawn in turn and kept until taken, whatever order they are taken
    /// in: a case taken before its turn is drawn on the spot (its thread then skips it), one
    /// taken after is its thread's. Either way the same inputs; the truths when drawn ahead.
    /// The tests that name early cases, one at a time (a later call lets the earlier go).
    static EARLY_TESTS: Mutex<()> = Mutex::new(());

    #[test]
    fn cases_named_early_are_the_cases_drawn_on_the_spot_in_any_order() {
        let _one = EARLY_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let specs = crate::cases::suite(
            Op::RmsNormBackward,
            Semantics::Llama,
            &[DType::F16],
            true,
            23,
            &[],
        );
        let early = &specs[2..6];
        prefetch_early(early);
        // a case named early is not started again by `prefetch`
        prefetch(&early[0]);
        assert!(!AHEAD
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|(s, _)| s == &early[0]));
        for s in [&early[3], &early[0], &early[2], &early[1]] {
            let d = take(s);
            assert_eq!(d.inputs, generate(s), "{}", s.id);
            if d.ahead {
                assert_eq!(d.truths, Some(oracle::truths(s, &d.inputs)), "{}", s.id);
            } else {
                assert!(d.truths.is_none());
            }
        }
        // all taken: none is kept
        assert!(!EARLY
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|e| early.contains(&e.spec)));
    }

    /// A verification's early cases replace what an earlier one named and never took (a
    /// worker's child verifies one kernel after another): those are no longer held, and a case
    /// of them asked for after all is drawn on the spot.
    #[test]
    fn early_cases_of_an_earlier_verification_are_let_go() {
        let _one = EARLY_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let suite = |seed| {
            crate::cases::suite(
                Op::RmsNormBackward,
                Semantics::Gemma,
                &[DType::Bf16],
                true,
                seed,
                &[],
            )
        };
        let (first, second) = (suite(31), suite(37));
        prefetch_early(&first[1..4]);
        prefetch_early(&second[1..3]);
        let held = |s: &CaseSpec| {
            EARLY
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .any(|e| &e.spec == s)
        };
        assert!(first[1..4].iter().all(|s| !held(s)));
        let d = take(&first[2]);
        assert!(!d.ahead && d.truths.is_none());
        assert_eq!(d.inputs, generate(&first[2]));
        for s in &second[1..3] {
            assert_eq!(take(s).inputs, generate(s));
        }
    }

    #[test]
    fn work_done_ahead_is_the_work_done_on_the_spot() {
        let specs = crate::cases::suite(
            Op::LayerNormBackward,
            Semantics::Default,
            &[DType::Bf16],
            true,
            7,
            &[],
        );
        let (a, b) = (&specs[3], &specs[4]);
        prefetch(a);
        prefetch(b);
        let d = take(a);
        assert!(d.ahead);
        assert_eq!(d.inputs, generate(a));
        let t = d
            .truths
            .as_ref()
            .expect("a backward case's truths are computed ahead");
        assert_eq!(t, &oracle::backward_truths(a, &d.inputs));
        let d = take(b);
        assert!(d.ahead);
        assert_eq!(d.inputs, generate(b));
        // nothing ahead for it: drawn on the spot
        let d = take(a);
        assert!(!d.ahead && d.truths.is_none());
        assert_eq!(d.inputs, generate(a));
        // a forward case: its output's truth
        let f = &crate::cases::suite(Op::RmsNorm, Semantics::Llama, &[DType::F16], true, 7, &[])[5];
        prefetch(f);
        let d = take(f);
        assert!(d.ahead);
        assert_eq!(d.truths, Some(vec![oracle::forward_truth(f, &d.inputs)]));
    }
}
