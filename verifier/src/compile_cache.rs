//! A CUBIN cache on disk: NVRTC's output for one (source, options incl. architecture and
//! include path, NVRTC version), so that the same kernel is compiled once per machine, not once
//! per verification. `KERNELIZE_COMPILE_CACHE` names the folder (`0` or `off`: no cache);
//! default `$XDG_CACHE_HOME/kernelize/cubin`, else `~/.cache/kernelize/cubin`. Entries are
//! written atomically (temporary file + rename); an unreadable or unloadable entry is compiled
//! again.

use sha2::{Digest as _, Sha256};
use std::path::{Path, PathBuf};

/// The cache folder, or `None` when caching is off or no home is known.
pub fn dir() -> Option<PathBuf> {
    match std::env::var("KERNELIZE_COMPILE_CACHE") {
        Ok(v) if v == "0" || v.eq_ignore_ascii_case("off") => None,
        Ok(v) if !v.is_empty() => Some(PathBuf::from(v)),
        _ => std::env::var_os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))
            .map(|c| c.join("kernelize").join("cubin")),
    }
}

/// The entry's name: sha256 over everything the CUBIN depends on.
pub fn key(source: &str, options: &[String], nvrtc_version: &str) -> String {
    let mut h = Sha256::new();
    for part in [nvrtc_version, &options.join("\u{1f}"), source] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    format!("{}.cubin", hex::encode(h.finalize()))
}

/// Where the entry for this compilation lives (`None`: no cache).
pub fn path(source: &str, options: &[String], nvrtc_version: &str) -> Option<PathBuf> {
    dir().map(|d| d.join(key(source, options, nvrtc_version)))
}

/// Where the PTX of the entry at `p` lives (beside it, `.ptx`): the capability audit reads it,
/// so a CUBIN is taken from the cache only with its PTX.
pub fn ptx_path(p: &Path) -> PathBuf {
    p.with_extension("ptx")
}

/// The cached image, when there is a non-empty one.
pub fn load(p: &Path) -> Option<Vec<u8>> {
    std::fs::read(p).ok().filter(|b| !b.is_empty())
}

/// Best effort: a cache that cannot be written only costs time.
pub fn store(p: &Path, bytes: &[u8]) {
    let Some(parent) = p.parent() else { return };
    if std::fs::create_dir_all(parent).is_err() {
        return;
    }
    let tmp = parent.join(format!(".{}.{}.tmp", std::process::id(), rand_suffix()));
    if std::fs::write(&tmp, bytes).is_ok() && std::fs::rename(&tmp, p).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

fn rand_suffix() -> u64 {
    use rand::Rng;
    rand::thread_rng().gen()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_depends_on_source_options_and_nvrtc() {
        let o = vec!["--gpu-architecture=sm_90".to_string()];
        let k = key("src", &o, "13.0");
        assert_eq!(k, key("src", &o, "13.0"));
        assert_ne!(k, key("src ", &o, "13.0"));
        assert_ne!(
            k,
            key("src", &["--gpu-architecture=sm_80".to_string()], "13.0")
        );
        assert_ne!(k, key("src", &o, "12.9"));
        // Parts are length-prefixed: moving a boundary changes the key.
        assert_ne!(
            key("b", &["a".to_string()], "x"),
            key("", &["a".to_string()], "xb")
        );
    }

    #[test]
    fn store_then_load_round_trips() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("sub").join("k.cubin");
        assert!(load(&p).is_none());
        store(&p, b"\x7fELF...");
        assert_eq!(load(&p).unwrap().len(), 7);
        // No temporary files left behind.
        assert_eq!(std::fs::read_dir(p.parent().unwrap()).unwrap().count(), 1);
    }
}
