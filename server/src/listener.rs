//! Accepting connections: at most `max_connections` open at once (the rest wait in the kernel's
//! backlog, costing this process no descriptor), each HTTP/1 connection closed when a request's
//! headers take longer than `header_timeout` (an idle keep-alive connection too), and the
//! process's descriptor limit raised, or the connection limit lowered, so the two fit.
//!
//! A stalled client therefore holds one slot for at most `header_timeout` (headers) or the
//! edge's body timeout (body), and can never exhaust descriptors: the accept loop waits for a
//! slot instead of failing with "Too many open files".

use axum::extract::ConnectInfo;
use axum::http::Request;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::ServiceExt;

/// Descriptors kept for everything but client connections: the listener, the database pool,
/// SQLite's files, logs, the worker's child processes.
pub const RESERVED_DESCRIPTORS: u64 = 128;

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
}

/// Raise the soft `RLIMIT_NOFILE` so that `max_connections` fit beside the reserve; when the
/// hard limit is too low, return the number of connections that do fit (and warn).
pub fn fit_descriptors(max_connections: usize) -> usize {
    let want = max_connections as u64 + RESERVED_DESCRIPTORS;
    match rlimit::increase_nofile_limit(want) {
        Ok(got) if got >= want => max_connections,
        Ok(got) => {
            let fit = got.saturating_sub(RESERVED_DESCRIPTORS).max(1) as usize;
            tracing::warn!(
                requested = max_connections,
                descriptor_limit = got,
                serving = fit,
                "the open-file limit cannot hold --max-connections; serving at most {fit} connections at once (raise the hard limit, e.g. `ulimit -Hn`, LimitNOFILE= in systemd)"
            );
            fit
        }
        Err(e) => {
            tracing::warn!(error = %e, "could not read or raise the open-file limit; keeping --max-connections");
            max_connections
        }
    }
}

/// Serve `app` on `listener` until `shutdown` completes, then let open requests finish (at
/// most 10 s).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    tokio::pin!(shutdown);
    loop {
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
            _ = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors or a connection aborted before accept: neither ends
                    // the server; back off a little so that a full table is not spun on.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        // Each request carries its peer's address (`ConnectInfo`): the limit on requests
        // without a token is per address.
        let app = app.clone();
        let service = tower::service_fn(move |mut req: Request<Incoming>| {
            req.extensions_mut().insert(ConnectInfo(peer));
            app.clone().oneshot(req)
        });
        let conn = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            // The slot is freed when the connection ends, however it ends.
            let _slot = slot;
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(Duration::from_secs(10)) => {
            tracing::warn!("requests still open 10 s after shutdown began; closing them");
        }
    }
    Ok(())
}
