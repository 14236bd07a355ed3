//! `/metrics`: the hub in the Prometheus (OpenMetrics) text format, from `prometheus-client`.
//!
//! - Requests by route template (never the raw path: its cardinality is the client's to
//!   choose), method and status, with a latency histogram per route and method. Requests no
//!   route matches are counted under the route `unmatched`.
//! - At each scrape, from the database (a few aggregate queries): jobs by state, the age of
//!   the oldest queued job, verifications by exactness class, workers seen and when each was
//!   last heard from (a claim, heartbeat, report or failure), lease expiries (counted from the
//!   audit log) and leases expired now. Several hub processes on one database agree on these.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// The media type of the OpenMetrics text format, which Prometheus reads.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: String,
    route: String,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    method: String,
    route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabels {
    class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WorkerLabels {
    worker: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Family<RouteLabels, Histogram>,
    jobs: Family<StateLabels, Gauge>,
    oldest_queued_age: FloatGauge,
    verifications: Family<ClassLabels, Gauge>,
    workers_seen: Gauge,
    worker_last_seen: Family<WorkerLabels, FloatGauge>,
    lease_expiries: Gauge,
    leases_expired_now: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("kernelize");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests answered, by method, route template and status",
            requests.clone(),
        );
        // 0.25 ms to about 8 s.
        let latency = Family::<RouteLabels, Histogram>::new_with_constructor(
            (|| Histogram::new(exponential_buckets(0.000_25, 2.0, 16))) as fn() -> Histogram,
        );
        registry.register(
            "http_request_duration_seconds",
            "Time from a request's arrival to its response's headers, by method and route template",
            latency.clone(),
        );
        let jobs = Family::<StateLabels, Gauge>::default();
        registry.register("jobs", "Verification jobs by state", jobs.clone());
        let oldest_queued_age = FloatGauge::default();
        registry.register(
            "oldest_queued_job_age_seconds",
            "Age of the oldest queued verification job (0 when none is queued)",
            oldest_queued_age.clone(),
        );
        let verifications = Family::<ClassLabels, Gauge>::default();
        registry.register(
            "verifications",
            "Verification records by exactness class",
            verifications.clone(),
        );
        let workers_seen = Gauge::default();
        registry.register(
            "workers_seen",
            "Workers (token/name) that have claimed a job",
            workers_seen.clone(),
        );
        let worker_last_seen = Family::<WorkerLabels, FloatGauge>::default();
        registry.register(
            "worker_last_seen_timestamp_seconds",
            "When each worker was last heard from (claim, heartbeat, report or failure), the most recent ones",
            worker_last_seen.clone(),
        );
        let lease_expiries = Gauge::default();
        registry.register(
            "lease_expiries",
            "Leases that ran out without a report (the job re-claimed, or failed on its last attempt)",
            lease_expiries.clone(),
        );
        let leases_expired_now = Gauge::default();
        registry.register(
            "leases_expired_now",
            "Running jobs whose lease has run out and that no worker has claimed again yet",
            leases_expired_now.clone(),
        );
        Metrics {
            registry,
            requests,
            latency,
            jobs,
            oldest_queued_age,
            verifications,
            workers_seen,
            worker_last_seen,
            lease_expiries,
            leases_expired_now,
        }
    }

    pub fn observe(&self, method: &str, route: &str, status: u16, seconds: f64) {
        self.requests
            .get_or_create(&RequestLabels {
                method: method.to_string(),
                route: route.to_string(),
                status,
            })
            .inc();
        self.latency
            .get_or_create(&RouteLabels {
                method: method.to_string(),
                route: route.to_string(),
            })
            .observe(seconds);
    }

    /// Set the database-derived gauges from `stats` at `now_ms`, then encode everything.
    pub fn render(&self, stats: &kernel_store::HubStats, now_ms: i64) -> String {
        for (state, n) in &stats.jobs {
            self.jobs
                .get_or_create(&StateLabels {
                    state: state.as_str().to_string(),
                })
                .set(*n);
        }
        let age = stats
            .oldest_queued_at
            .as_deref()
            .and_then(unix_seconds)
            .map(|t| (now_ms as f64 / 1000.0 - t).max(0.0))
            .unwrap_or(0.0);
        self.oldest_queued_age.set(age);
        self.verifications.clear();
        for (class, n) in &stats.verifications {
            self.verifications
                .get_or_create(&ClassLabels {
                    class: class.clone(),
                })
                .set(*n);
        }
        self.workers_seen.set(stats.workers_seen);
        self.worker_last_seen.clear();
        for (worker, seen) in &stats.workers {
            if let Some(t) = unix_seconds(seen) {
                self.worker_last_seen
                    .get_or_create(&WorkerLabels {
                        worker: worker.clone(),
                    })
                    .set(t);
            }
        }
        self.lease_expiries.set(stats.lease_expiries);
        self.leases_expired_now.set(stats.leases_expired_now);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("encoding metrics into a String");
        out
    }
}

/// Seconds since the epoch of an RFC 3339 time.
fn unix_seconds(t: &str) -> Option<f64> {
    let t = time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()?;
    Some(t.unix_timestamp_nanos() as f64 / 1e9)
}
