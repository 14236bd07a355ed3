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
