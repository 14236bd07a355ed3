//! conformance: later
