//! Loading the bundled kernels (`kernels/`) into the store at start-up, idempotently by digest.

use kernel_registry::KernelBundle;
use kernel_store::{Inserted, Store, StoreError};
use std::path::Path;

#[derive(Debug, Default)]
pub struct Loaded {
    pub new: usize,
    pub unchanged: usize,
}

/// Load every `DIR/*/kernel.toml`. A bundled kernel whose content changed while its name and
/// version stayed is an error (kernels are immutable), as is an invalid one.
pub async fn load(store: &Store, dir: &Path) -> anyhow::Result<Loaded> {
    let mut folders: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot read the bundled kernels folder {}: {e}",
                dir.display()
            )
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("kernel.toml").is_file())
        .collect();
    folders.sort();
    let mut loaded = Loaded::default();
    for f in folders {
        let bundle = KernelBundle::load_dir(&f)
            .map_err(|e| anyhow::anyhow!("bundled kernel {}: {e}", f.display()))?;
        match store.insert_kernel(&bundle, "bundled", "bundled").await {
            Ok(Inserted::New { kernel, job_id }) => {
                tracing::info!(name = %kernel.name, version = %kernel.version, digest = %kernel.digest, job_id, "bundled kernel stored");
                loaded.new += 1;
            }
            Ok(Inserted::Existing(_)) => loaded.unchanged += 1,
            Err(StoreError::Conflict(m)) => anyhow::bail!(
                "bundled kernel {}: {m}. Bump `version` in its kernel.toml when you change it",
                f.display()
            ),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(loaded)
}

/// What `import_certificates` did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Imported {
    pub new: usize,
    pub known: usize,
    /// Certificates of kernels this hub does not hold (an older version of a bundled kernel).
    pub stale: usize,
    /// Files refused (unreadable, untrusted, not certifying their report), each with why.
    pub refused: Vec<String>,
}

/// Import the verifications recorded on the project's GPU runs: `DIR/certificates/ARCH/*.json`
/// (verifications as a hub serves them: report and certificate), each checked against the keys
/// in `DIR/certificates/trusted-keys.txt` and its report, for a kernel this hub holds. They are
/// stored as imported verifications (no job of this hub), so that a fresh hub resolves for
/// those architectures out of the box; a newer verdict of a local worker supersedes them.
pub async fn import_certificates(store: &Store, dir: &Path) -> anyhow::Result<Imported> {
    use kernel_registry::cert::Certificate;
    use kernel_registry::VerificationReport;
    let root = dir.join("certificates");
    let mut done = Imported::default();
    let keys_file = root.join("trusted-keys.txt");
    let Ok(keys) = std::fs::read_to_string(&keys_file) else {
        return Ok(done);
    };
    let trusted = kernel_registry::cert::parse_key_list(&keys);
    let mut files: Vec<_> = std::fs::read_dir(&root)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .flat_map(|d| std::fs::read_dir(d).into_iter().flatten())
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    for f in files {
        let checked = (|| -> anyhow::Result<(VerificationReport, Certificate)> {
            let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&f)?)?;
            let report: VerificationReport = serde_json::from_value(v["report"].clone())?;
            let cert: Certificate = serde_json::from_value(v["certificate"].clone())?;
            cert.verify(&trusted)?.check_report(&report)?;
            Ok((report, cert))
        })();
        let (report, cert) = match checked {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(file = %f.display(), "bundled certificate refused: {e:#}");
                done.refused.push(format!("{}: {e:#}", f.display()));
                continue;
            }
        };
        let digest = &report.kernel.digest;
        if store.kernel_by_digest(digest).await?.is_none() {
            done.stale += 1;
            continue;
        }
        match store
            .import_verification(digest, &report, &cert, "bundled")
            .await?
        {
            Some(vid) => {
                tracing::info!(kernel = %format!("{}@{}", report.kernel.name, report.kernel.version), arch = %report.device.arch, verification = vid, "bundled certificate imported");
                done.new += 1;
            }
            None => done.known += 1,
        }
    }
    Ok(done)
}
