//! `/metrics` scraped from a real `kernelize serve` after a known sequence of requests and
//! jobs, on SQLite and PostgreSQL: every count is exact.

mod support;

use reqwest::StatusCode;
use serde_json::json;
use std::time::Duration;
use support::{bundle_files, Backend, TestServer};

both_backends!(metrics_count_requests_jobs_workers_and_expired_leases);

/// One sample of the OpenMetrics text: `name{labels} value`, matched on name and every label
/// given (`None` when absent).
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        let (n, rest) = series.split_once('{').unwrap_or((series, "}"));
        if n != name {
            return None;
        }
        let rest = rest.strip_suffix('}')?;
        let all = labels
            .iter()
            .all(|(k, v)| rest.split(',').any(|kv| kv == format!("{k}=\"{v}\"")));
        all.then(|| value.parse().ok()).flatten()
    })
}

async fn metrics_count_requests_jobs_workers_and_expired_leases(b: Backend) {
    let srv = TestServer::start(&b, &["--no-bundled", "--lease-seconds", "1"]).await;
    let submit = srv.token("submit");
    let worker = srv.token("worker");
    for name in ["m1", "m2", "m3"] {
        let (m, s) = bundle_files(name, "1.0.0", "");
        let (st, _) = srv
            .post("/v1/kernels", &submit, &json!({"manifest": m, "source": s}))
            .await;
        assert_eq!(st, StatusCode::CREATED);
    }
    // Worker a claims m1 and goes silent; b takes it over once the lease has run out and
    // reports; c claims m2 and goes silent too.
    let claim = |name: &'static str| {
        let (srv, worker) = (&srv, &worker);
        async move {
            let (st, c) = srv
                .post("/v1/jobs/claim", worker, &json!({"worker": name}))
                .await;
            assert_eq!(st, StatusCode::OK, "{c}");
            c
        }
    };
    let a = claim("a").await;
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let bb = claim("b").await;
    assert_eq!(bb["job"]["id"], a["job"]["id"]);
    let report = support::recorded_report("recorded/silu_and_mul", &bb, "sm_90");
    let job = bb["job"]["id"].as_i64().unwrap();
    let (st, r) = srv
        .post(
            &format!("/v1/jobs/{job}/report"),
            &worker,
            &json!({"lease_id": bb["lease_id"], "report": report}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{r}");
    claim("c").await;
    tokio::time::sleep(Duration::from_millis(1300)).await;
    for _ in 0..3 {
        assert_eq!(srv.get("/healthz").await.0, StatusCode::OK);
    }
    assert_eq!(
        srv.get("/v1/kernels/nope/1.0.0").await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(srv.get("/no/such/route").await.0, StatusCode::NOT_FOUND);

    let http = reqwest::Client::new();
    let scrape = || async {
        let res = http.get(srv.url("/metrics")).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        let ctype = res.headers()["content-type"].to_str().unwrap().to_string();
        assert!(ctype.starts_with("application/openmetrics-text"), "{ctype}");
        res.text().await.unwrap()
    };
    let text = scrape().await;
    let req = |method, route, status| {
        sample(
            &text,
            "kernelize_http_requests_total",
            &[("method", method), ("route", route), ("status", status)],
        )
    };
    assert_eq!(req("GET", "/healthz", "200"), Some(3.0), "{text}");
    assert_eq!(req("GET", "/v1/kernels/{name}/{version}", "404"), Some(1.0));
    assert_eq!(req("GET", "unmatched", "404"), Some(1.0));
    assert_eq!(req("POST", "/v1/kernels", "201"), Some(3.0));
    assert_eq!(req("POST", "/v1/jobs/claim", "200"), Some(3.0));
    assert_eq!(req("POST", "/v1/jobs/{id}/report", "201"), Some(1.0));
    assert_eq!(req("GET", "/metrics", "200"), None, "counted once answered");
    let count = sample(
        &text,
        "kernelize_http_request_duration_seconds_count",
        &[("method", "GET"), ("route", "/healthz")],
    );
    assert_eq!(count, Some(3.0));

    let jobs = |state| sample(&text, "kernelize_jobs", &[("state", state)]);
    assert_eq!(
        [
            jobs("queued"),
            jobs("running"),
            jobs("done"),
            jobs("failed")
        ],
        [Some(1.0), Some(1.0), Some(1.0), Some(0.0)]
    );
    let age = sample(&text, "kernelize_oldest_queued_job_age_seconds", &[]).unwrap();
    assert!((2.6..120.0).contains(&age), "m3 queued {age} s ago");
    assert_eq!(
        sample(&text, "kernelize_verifications", &[("class", "bit_exact")]),
        Some(1.0)
    );
    assert_eq!(sample(&text, "kernelize_workers_seen", &[]), Some(3.0));
    for w in ["a", "b", "c"] {
        let seen = sample(
            &text,
            "kernelize_worker_last_seen_timestamp_seconds",
            &[("worker", &format!("test-worker/{w}"))],
        );
        assert!(seen.is_some_and(|t| t > 1.7e9), "worker {w}: {seen:?}");
    }
    assert_eq!(sample(&text, "kernelize_lease_expiries", &[]), Some(1.0));
    assert_eq!(
        sample(&text, "kernelize_leases_expired_now", &[]),
        Some(1.0)
    );
    assert!(text.trim_end().ends_with("# EOF"));

    // The first scrape is counted by the second.
    let again = scrape().await;
    assert_eq!(
        sample(
            &again,
            "kernelize_http_requests_total",
            &[("method", "GET"), ("route", "/metrics"), ("status", "200")]
        ),
        Some(1.0)
    );
}
