//! The GPU verifier.
