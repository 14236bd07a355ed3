//! What `--db` accepts: a URL, or a bare path meaning a SQLite file.

use crate::{Backend, Result, StoreError};

/// Normalise what a user passes as `--db`: a URL, or a bare path meaning a SQLite file.
pub fn normalise_url(url: &str) -> Result<(String, Backend)> {
    let bad = |why: &str| StoreError::BadUrl {
        url: url.to_string(),
        why: why.to_string(),
    };
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok((url.to_string(), Backend::Postgres));
    }
    let url = if url.contains("://") || url.starts_with("sqlite:") {
        url.to_string()
    } else if url.is_empty() {
        return Err(bad(
            "it is empty; use sqlite://PATH or postgres://USER@HOST/DB",
        ));
    } else {
        format!("sqlite://{url}")
    };
    if !url.starts_with("sqlite:") {
        return Err(bad(
            "only sqlite://PATH (the default) and postgres://USER@HOST:PORT/DB are supported",
        ));
    }
    // Create the file on first run unless the user chose a mode.
    let url = if url.contains("mode=") || url.contains(":memory:") {
        url
    } else if url.contains('?') {
        format!("{url}&mode=rwc")
    } else {
        format!("{url}?mode=rwc")
    };
    Ok((url, Backend::Sqlite))
}
