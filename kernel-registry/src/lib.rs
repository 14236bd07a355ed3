//! kernelize's core: domain types, kernel manifests, content digests, verification reports,
//! exactness policies and the storage of all of them.

pub mod domain;
pub mod manifest;
pub mod policy;
pub mod report;
pub mod storage;

pub use domain::{Arch, DType, Digest, Op, ParseError, Semantics};
pub use manifest::{KernelBundle, Manifest, ManifestError};
pub use policy::Policy;
pub use report::VerificationReport;
