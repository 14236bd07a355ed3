//! A case's host work done ahead of it: while one case runs (mostly waiting for the GPU), the
//! next case's inputs are drawn on a thread of their own, and for a backward op the f64
//! oracle's truth of its gradients computed from them (seconds each for the largest shapes).
//! `crate::verify` names the next case (`Executor::prefetch`), the process that runs it starts
//! the work ([`prefetch`]) and the case takes it ([`take`]). A hint only: a case whose work was
//! not started ahead does it on the spot, with the same result.

use crate::cases::{generate, CaseInputs, CaseSpec};
use crate::oracle::{self, Truth};
use std::sync::Mutex;
use std::thread::JoinHandle;

/// A case's inputs, and the oracle's truth of its gradients (a backward op's, in
/// [`kernel_registry::Op::gradients`] order) where it was computed ahead.
pub struct Drawn {
    pub inputs: CaseInputs,
    pub truths: Option<Vec<Truth>>,
}

type Slot = Option<(CaseSpec, JoinHandle<Drawn>)>;
static AHEAD: Mutex<Slot> = Mutex::new(None);

/// Start `spec`'s host work on a thread of its own, for the case that asks for it next
/// ([`take`]). One case ahead at most (a later call replaces an earlier one that was not taken:
/// that thread is left to finish on its own); the large-index cases draw their data on the GPU.
pub fn prefetch(spec: &CaseSpec) {
    if spec.large_index {
        return;
    }
    let s = spec.clone();
    let handle = std::thread::spawn(move || {
        let inputs = generate(&s);
        let truths =
            s.op.is_backward()
                .then(|| oracle::backward_truths(&s, &inputs));
        Drawn { inputs, truths }
    });
    *AHEAD.lock().unwrap_or_else(|e| e.into_inner()) = Some((spec.clone(), handle));
}

/// `spec`'s inputs (and its gradients' truth) as [`prefetch`] made them, else its inputs drawn
/// now (`truths` then `None`: the verdict computes them). The same bytes either way
/// ([`generate`] and the oracle are functions of the spec).
pub fn take(spec: &CaseSpec) -> Drawn {
    let ahead = AHEAD.lock().unwrap_or_else(|e| e.into_inner()).take();
    let now = || Drawn {
        inputs: generate(spec),
        truths: None,
    };
    match ahead {
        Some((s, handle)) if s == *spec => handle.join().unwrap_or_else(|_| now()),
        _ => now(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernel_registry::{DType, Op, Semantics};

    /// A case's inputs are the same bytes whether [`prefetch`] drew them ahead or [`take`] draws
    /// them on the spot (another case's prefetch is not taken for it), and a backward case's
    /// truths computed ahead are the oracle's.
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
        let d = take(a);
        assert_eq!(d.inputs, generate(a));
        if let Some(t) = &d.truths {
            assert_eq!(t, &oracle::backward_truths(a, &d.inputs));
        }
        prefetch(a);
        let d = take(b);
        assert_eq!(d.inputs, generate(b));
        assert!(d.truths.is_none());
    }
}
