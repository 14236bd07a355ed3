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

pub use domain::{
    Arch, DType, Digest, Gradient, Op, ParseError, Semantics, Stage, ABI_ALIGN_BYTES,
};
pub use manifest::{KernelBundle, Manifest, ManifestError, Runtime};
pub use policy::Policy;
pub use report::VerificationReport;

/// The fixtures this crate writes for the Python client's tests (python/tests/fixtures/).
#[cfg(test)]
pub(crate) mod fixtures {
    /// Check that `python/tests/fixtures/NAME` holds `want`; with KERNELIZE_UPDATE_FIXTURES=1
    /// write it instead. `test` is the cargo test filter that rewrites it (for the message).
    pub fn check_current(name: &str, want: &str, test: &str) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../python/tests/fixtures")
            .join(name);
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        if have == want {
            return;
        }
        if std::env::var("KERNELIZE_UPDATE_FIXTURES").as_deref() == Ok("1") {
            std::fs::write(&path, want).unwrap();
        } else {
            panic!(
                "{} is not current: run `KERNELIZE_UPDATE_FIXTURES=1 cargo test -p kernel-registry {test}` and commit it",
                path.display()
            );
        }
    }
}
