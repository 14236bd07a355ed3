//! Accepting connections: at most `max_connections` open at once, each HTTP/1 connection closed
//! when a request's headers take longer than `header_timeout` (an idle keep-alive connection
//! too), and the process's descriptor limit raised, or the connection limit lowered, so the two
//! fit.
//!
//! When every slot is taken, a new connection is accepted and the connection that has waited
//! longest on its client is closed to make room: one that has not sent its request's headers
//! (stalled, or idle between requests), is sending a body without a valid token, or has not
//! read its answer. So stalled clients cannot lock fresh ones out, however many they open;
//! they only close each other. A connection whose request is being handled, or a body sent
//! with a valid token, is never closed for room: when every connection is busy, new ones wait in the kernel's backlog
//! (costing this process no descriptor) until a slot frees. A stalled client otherwise holds
//! its slot for at most `header_timeout` (headers) or the edge's body timeout (body), and the
//! server never runs out of descriptors: at most one connection beyond `max_connections` is
//! open, for the moment its room is made.

use axum::extract::ConnectInfo;
use axum::http::Request;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;
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
    let open = Arc::new(Connections::default());
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    tokio::pin!(shutdown);
    'accept: loop {
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
        // A slot: a free one, or the one of the connection that has waited longest on its
        // client, closed for this one; else wait until one frees (the rest wait in the
        // backlog meanwhile).
        let slot = loop {
            if let Ok(slot) = slots.clone().try_acquire_owned() {
                break slot;
            }
            let wait = if open.close_longest_waiting() {
                // Its slot frees as soon as its task sees the signal.
                Duration::from_secs(1)
            } else {
                Duration::from_millis(50)
            };
            tokio::select! {
                slot = slots.clone().acquire_owned() => break slot.expect("the semaphore is never closed"),
                _ = tokio::time::sleep(wait) => {}
                _ = &mut shutdown => break 'accept,
            }
        };
        let (conn_handle, closed_for_room) = open.add();
        let app = app.clone();
        let handle = conn_handle.clone();
        let service = tower::service_fn(move |mut req: Request<Incoming>| {
            // Each request carries its peer's address (the limit on requests without a
            // token is per address) and its connection (the edge marks it waiting while it
            // reads a body without a valid token).
            req.extensions_mut().insert(ConnectInfo(peer));
            req.extensions_mut().insert(handle.clone());
            let busy = handle.busy();
            let answer = app.clone().oneshot(req);
            async move {
                let res = answer.await;
                // Busy while the request is handled; then the connection waits on its client
                // again: to read the answer (a client that stops reading holds no slot against
                // a newcomer), then for its next request.
                drop(busy);
                res
            }
        });
        let conn = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            // The slot and the entry are freed when the connection ends, however it ends.
            let _slot = slot;
            let _entry = conn_handle;
            tokio::select! {
                ended = conn => if let Err(e) = ended {
                    tracing::debug!(error = %e, "connection ended with an error");
                },
                _ = closed_for_room.notified() => {
                    tracing::debug!(%peer, "closed a connection waiting on its client to make room for a new one");
                }
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

/// The open connections, and since when each has waited on its client (none while a request
/// of it is handled).
#[derive(Default)]
struct Connections {
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    next: u64,
    open: HashMap<u64, Entry>,
}

struct Entry {
    waiting_since: Option<Instant>,
    /// Signalled to close the connection to make room.
    close: Arc<Notify>,
}

impl Connections {
    fn add(self: &Arc<Self>) -> (Connection, Arc<Notify>) {
        let close = Arc::new(Notify::new());
        let mut t = self
            .table
            .lock()
            .expect("the connection table is never poisoned");
        t.next += 1;
        let id = t.next;
        t.open.insert(
            id,
            Entry {
                waiting_since: Some(Instant::now()),
                close: close.clone(),
            },
        );
        let entry = Arc::new(Registered {
            id,
            open: self.clone(),
        });
        (Connection(entry), close)
    }

    /// Signal the connection that has waited longest on its client to close; false when none
    /// waits.
    fn close_longest_waiting(&self) -> bool {
        let mut t = self
            .table
            .lock()
            .expect("the connection table is never poisoned");
        let Some(id) = t
            .open
            .iter()
            .filter_map(|(id, e)| Some((e.waiting_since?, *id)))
            .min()
            .map(|(_, id)| id)
        else {
            return false;
        };
        if let Some(e) = t.open.remove(&id) {
            e.close.notify_one();
        }
        true
    }

    fn set_waiting(&self, id: u64, waiting: bool) {
        let mut t = self
            .table
            .lock()
            .expect("the connection table is never poisoned");
        if let Some(e) = t.open.get_mut(&id) {
            e.waiting_since = waiting.then(Instant::now);
        }
    }
}

/// A connection, as its requests carry it (an extension).
#[derive(Clone)]
pub struct Connection(Arc<Registered>);

/// Removes its connection from the table when the last handle goes.
struct Registered {
    id: u64,
    open: Arc<Connections>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Ok(mut t) = self.open.table.lock() {
            t.open.remove(&self.id);
        }
    }
}

impl Connection {
    /// The connection waits on its client (a body) until the guard goes: it may be closed to
    /// make room meanwhile.
    pub fn waiting(&self) -> Waiting {
        self.0.open.set_waiting(self.0.id, true);
        Waiting(self.clone())
    }

    /// A request of the connection is handled until the guard goes; then it waits on its
    /// client again (to read the answer, then for the next request).
    fn busy(&self) -> Busy {
        self.0.open.set_waiting(self.0.id, false);
        Busy(self.clone())
    }
}

/// See `Connection::waiting`.
pub struct Waiting(Connection);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0 .0.open.set_waiting(self.0 .0.id, false);
    }
}

/// See `Connection::busy`.
struct Busy(Connection);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0 .0.open.set_waiting(self.0 .0.id, true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_waiting_longest_is_closed_and_a_busy_one_never() {
        let open = Arc::new(Connections::default());
        let (a, close_a) = open.add();
        let (b, close_b) = open.add();
        let (c, _close_c) = open.add();
        // a is busy (a request handled), b waits on a body, c waits on headers since last.
        let busy_a = a.busy();
        let waiting_b = b.waiting();
        drop(c.busy()); // c answered: waiting again, since now
        assert!(open.close_longest_waiting());
        // b: waiting since before c's answer.
        let signalled = |n: &Notify| {
            let f = n.notified();
            tokio::pin!(f);
            f.as_mut().enable()
        };
        assert!(signalled(&close_b) && !signalled(&close_a));
        drop(waiting_b);
        assert!(open.close_longest_waiting(), "c");
        assert!(
            !open.close_longest_waiting(),
            "only a is left, and it is busy"
        );
        drop(busy_a);
        assert!(open.close_longest_waiting(), "a, once answered");
        assert!(signalled(&close_a));
        drop((a, b, c));
        assert!(open.table.lock().unwrap().open.is_empty());
    }
}
