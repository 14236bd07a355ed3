//! kernelize's core: domain types, kernel manifests, content digests, verification reports
//! and exactness policies. Pure: no database, no async runtime (storage is `kernel-store`).

pub mod backward;
pub mod capability;
pub mod cert;
pub mod device;
pub mod domain;
pub mod manifest;
pub mod policy;
pub mod report;

pub use domain::{Arch, DType, Digest, Op, ParseError, Semantics, Stage};
pub use manifest::{KernelBundle, Manifest, ManifestError, Runtime};
pub use policy::Policy;
pub use report::VerificationReport;
