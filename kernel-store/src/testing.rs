//! Test support shared by this crate's tests and the server's end-to-end tests.
#![doc(hidden)]

use crate::Store;

/// A fresh SQLite database for one test: `url` names a file in a temporary folder that is
/// removed when this is dropped (keep it alive as long as the store).
pub struct TempSqlite {
    pub url: String,
    file: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl TempSqlite {
    /// The database file (files beside it go with the folder too).
    pub fn file(&self) -> &std::path::Path {
        &self.file
    }
}

/// A fresh SQLite database for one test (`TempSqlite`): the one way tests of every crate open
/// a temporary SQLite store (`Store::open(&db.url)` to migrate it, `Store::connect` not to).
pub fn fresh_sqlite() -> TempSqlite {
    let dir = tempfile::tempdir().expect("a temporary folder for a test database");
    let file = dir.path().join("kernelize.db");
    let url = format!("sqlite://{}", file.display());
    TempSqlite {
        url,
        file,
        _dir: dir,
    }
}

/// The URL of a fresh PostgreSQL database for one test, or `None` (with a loud message)
/// when no server answers — unless `KERNELIZE_REQUIRE_POSTGRES=1` (set by `.ci/run`),
/// which makes that a failure. The server is `KERNELIZE_TEST_POSTGRES`, default
/// `postgres://postgres@127.0.0.1:5432/test`.
pub async fn fresh_postgres_url(what: &str) -> Option<String> {
    let admin = std::env::var("KERNELIZE_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let required = std::env::var("KERNELIZE_REQUIRE_POSTGRES").as_deref() == Ok("1");
    let skip = |why: String| {
        // Straight to the stderr handle: libtest captures `eprintln!` of passing tests,
        // and a skip must be seen.
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "\n*** SKIPPING PostgreSQL {what}: {why}\n*** set KERNELIZE_REQUIRE_POSTGRES=1 to make this a failure\n"
        );
    };
    // A quick probe, so that a machine without PostgreSQL skips at once instead of
    // waiting out the pool's connect timeout in every test.
    if !required && !reachable(&admin) {
        skip(format!("nothing answers at {admin}"));
        return None;
    }
    let store = match Store::connect(&admin).await {
        Ok(s) => s,
        Err(e) if !required => {
            skip(e.to_string());
            return None;
        }
        Err(e) => panic!("PostgreSQL is required (KERNELIZE_REQUIRE_POSTGRES=1) but: {e}"),
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos();
    // The clock alone can give two tests of one process the same name (its resolution is
    // coarser than nanoseconds on some machines): a counter makes them distinct.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let db = format!("kz_test_{nanos:x}_{}_{n}", std::process::id());
    store
        .execute_raw(&format!("CREATE DATABASE {db}"))
        .await
        .expect("creating a test database");
    store.close().await;
    let base = admin.rsplit_once('/').expect("URL with a database").0;
    Some(format!("{base}/{db}"))
}

/// Whether a TCP connection to the URL's host:port opens within 2 s.
fn reachable(url: &str) -> bool {
    use std::net::ToSocketAddrs;
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or(url);
    let host_port = rest.rsplit_once('@').map(|(_, h)| h).unwrap_or(rest);
    let host_port = host_port.split(['/', '?']).next().unwrap_or("");
    let host_port = if host_port.contains(':') {
        host_port.to_string()
    } else {
        format!("{host_port}:5432")
    };
    host_port.to_socket_addrs().is_ok_and(|mut addrs| {
        addrs.any(|a| {
            std::net::TcpStream::connect_timeout(&a, std::time::Duration::from_secs(2)).is_ok()
        })
    })
}

/// One `#[tokio::test]` per backend for each named `async fn NAME(store: Store)` of the calling
/// test file: `on_sqlite::NAME` with `super::sqlite().await` (a `(Store, TempSqlite)`) and
/// `on_postgres::NAME` with `super::postgres().await` (an `Option<Store>`: `None`, loudly, where
/// there is no server). The calling file defines those two functions, so it chooses whether
/// the store comes migrated.
#[macro_export]
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod on_sqlite { $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() { let (s, _dir) = super::sqlite().await; super::$name(s).await; }
        )* }
        mod on_postgres { $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() { if let Some(s) = super::postgres().await { super::$name(s).await; } }
        )* }
    };
}
