//! A token kept in a file (mode 0600) and reused while the store accepts it: `serve --worker`'s
//! embedded worker and `kernelize token ensure` (GPU workers in containers) keep one token across
//! restarts instead of minting a new one at every start.

use anyhow::Context;
use kernel_store::{normalise_url, Backend, Store, TokenCheck};
use std::io::Write;
use std::path::{Path, PathBuf};

/// What `ensure` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ensured {
    /// The file's token is still valid with the asked scopes.
    Reused,
    /// A new token was created and written to the file.
    Created,
}

/// The token in `path` when the store still accepts it with every scope of `scopes`; else a new
/// token named `name`, written to `path` (mode 0600, atomically) before it is returned.
pub async fn ensure(
    store: &Store,
    path: &Path,
    name: &str,
    scopes: &[String],
) -> anyhow::Result<(String, Ensured)> {
    if let Some(token) = read_existing(path)? {
        if let TokenCheck::Valid(info) = store.check_token(&token).await? {
            let held = info.scopes;
            if scopes.iter().all(|s| held.contains(s)) {
                return Ok((token, Ensured::Reused));
            }
            tracing::warn!(file = %path.display(), held = ?held, wanted = ?scopes, "the token file's token lacks a scope; creating a new one");
        } else {
            tracing::info!(file = %path.display(), "the token file's token is unknown to this database, expired or revoked; creating a new one");
        }
    }
    let (_, token) = store
        .create_token(name, scopes, kernel_store::DEFAULT_TOKEN_LIFETIME, "admin")
        .await?;
    write_private(path, &token)?;
    Ok((token, Ensured::Created))
}

/// Read a token file a worker was given (`--token-file`); an error says how to make one.
pub fn read(path: &Path) -> anyhow::Result<String> {
    match read_existing(path)? {
        Some(t) => Ok(t),
        None => anyhow::bail!(
            "the token file {} does not exist or is empty: create it with `kernelize token ensure --scope worker --file {}` on the hub's database (or pass --token)",
            path.display(),
            path.display()
        ),
    }
}

/// Where `serve --worker` keeps its token by default: beside a SQLite database file, else
/// (PostgreSQL) `kernelize.worker-token` in the current directory; `None` for an in-memory
/// database, whose tokens do not outlive the process anyway.
pub fn default_path(db_url: &str) -> Option<PathBuf> {
    let (url, backend) = normalise_url(db_url).ok()?;
    match backend {
        Backend::Postgres => Some(PathBuf::from("kernelize.worker-token")),
        Backend::Sqlite => {
            let rest = url
                .strip_prefix("sqlite://")
                .or_else(|| url.strip_prefix("sqlite:"))?;
            let (file, query) = rest.split_once('?').unwrap_or((rest, ""));
            if file.is_empty() || file.contains(":memory:") || query.contains("mode=memory") {
                return None;
            }
            Some(PathBuf::from(format!("{file}.worker-token")))
        }
    }
}

/// The trimmed content of `path`, `None` when it is missing or blank.
fn read_existing(path: &Path) -> anyhow::Result<Option<String>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(e).with_context(|| {
                format!(
                    "reading the token file {} (check its owner and mode; it should be 0600 and owned by this user)",
                    path.display()
                )
            })
        }
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(m) = std::fs::metadata(path) {
            let mode = m.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                tracing::warn!(file = %path.display(), mode = format!("{mode:o}"), "the token file is readable by other users; `chmod 600` it");
            }
        }
    }
    let token = text.trim();
    Ok((!token.is_empty()).then(|| token.to_string()))
}

/// Write `token` to `path` readable by its owner only: a temporary file created with mode 0600
/// in the same folder, then renamed over `path`, so a reader never sees half a token.
pub(crate) fn write_private(path: &Path, token: &str) -> anyhow::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("creating the folder {} for the token file", dir.display()))?;
    let file_name = path
        .file_name()
        .with_context(|| format!("the token file {} has no file name", path.display()))?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        file_name.to_string_lossy(),
        std::process::id()
    ));
    // A stale temporary file of a crashed run could have another mode: start afresh.
    let _ = std::fs::remove_file(&tmp);
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let written = (|| {
        let mut f = opts.open(&tmp)?;
        f.write_all(format!("{token}\n").as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| {
            format!(
                "writing the token file {} (is its folder writable by this user?)",
                path.display()
            )
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::default_path;
    use std::path::PathBuf;

    #[test]
    fn default_path_sits_beside_a_sqlite_file() {
        for (url, want) in [
            (
                "sqlite://data/kernelize.db",
                Some("data/kernelize.db.worker-token"),
            ),
            (
                "sqlite:///var/lib/kernelize/kernelize.db?mode=rwc",
                Some("/var/lib/kernelize/kernelize.db.worker-token"),
            ),
            ("kernelize.db", Some("kernelize.db.worker-token")),
            (
                "postgres://u@db:5432/kernelize",
                Some("kernelize.worker-token"),
            ),
            ("sqlite::memory:", None),
            ("sqlite://x.db?mode=memory", None),
        ] {
            assert_eq!(
                default_path(url),
                want.map(PathBuf::from),
                "default token file for --db {url}"
            );
        }
    }
}
