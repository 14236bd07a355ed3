//! A case's host work done ahead of it: while one case runs (mostly waiting for the GPU), the
//! next case's inputs are drawn on a thread of their own, and the f64 oracle's truth of its
//! output (a forward op) or of its gradients (a backward op) computed from them (seconds each
//! for the largest backward shapes).
//! `crate::verify` names the next case (`Executor::prefetch`), the process that runs it starts
//! the work ([`prefetch`]) and the case takes it ([`take`]). A hint only: a case whose work was
//! not started ahead does it on the spot, with the same result. `KERNELIZE_AHEAD=0` turns it
//! off (a host short of memory: up to two more cases' inputs are held, about 1 GB each at the
//! suite's largest f32 shapes).

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

/// Start `spec`'s host work on a thread of its own, for the case that asks for it ([`take`]).
/// At most [`KEPT`] cases ahead (an older one not taken is dropped: its thread finishes on its
/// own); the large-index cases draw their data on the GPU.
pub fn prefetch(spec: &CaseSpec) {
    if spec.large_index || !enabled(std::env::var_os("KERNELIZE_AHEAD").as_deref()) {
        return;
    }
    let s = spec.clone();
    let handle = std::thread::spawn(move || {
        let inputs = generate(&s);
        let truths = Some(oracle::truths(&s, &inputs));
        Drawn {
            inputs,
            truths,
            ahead: true,
        }
    });
    let mut pending = AHEAD.lock().unwrap_or_else(|e| e.into_inner());
    pending.push((spec.clone(), handle));
    if pending.len() > KEPT {
        pending.remove(0);
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
