//! A small HTTP client of the kernelize API, shared by `submit` and `worker`.

use anyhow::{anyhow, Context};
use reqwest::StatusCode;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

/// How many times a request answered 429 is sent again (after its `Retry-After`).
const MAX_RATE_WAITS: u32 = 5;

#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Client {
    pub fn new(server: &str, token: Option<String>) -> anyhow::Result<Client> {
        let base = server.trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            anyhow::bail!("--server `{server}` must be an http:// or https:// URL, e.g. http://127.0.0.1:8080");
        }
        Ok(Client {
            http: reqwest::Client::builder()
                .timeout(std::time::Duration::from_secs(60))
                .build()?,
            base,
            token,
        })
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    async fn send(
        &self,
        req: reqwest::RequestBuilder,
        what: &str,
    ) -> anyhow::Result<(StatusCode, Value)> {
        let req = match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        };
        // A 429 (this token's write rate) is waited out as the server says, a few times.
        let mut waits = 0;
        let r = loop {
            let attempt = req
                .try_clone()
                .ok_or_else(|| anyhow!("{what}: the request cannot be repeated"))?;
            let r = attempt.send().await.with_context(|| {
                format!(
                    "{what}: cannot reach {} (is `kernelize serve` running there?)",
                    self.base
                )
            })?;
            if r.status() != StatusCode::TOO_MANY_REQUESTS || waits == MAX_RATE_WAITS {
                break r;
            }
            waits += 1;
            let secs = r
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(1)
                .clamp(1, 60);
            tracing::warn!(%what, retry_after_s = secs, "the server limits this token's writes; waiting");
            tokio::time::sleep(std::time::Duration::from_secs(secs)).await;
        };
        let status = r.status();
        let body = if status == StatusCode::NO_CONTENT {
            Value::Null
        } else {
            r.json().await.unwrap_or(Value::Null)
        };
        Ok((status, body))
    }

    pub async fn get(&self, path: &str) -> anyhow::Result<(StatusCode, Value)> {
        self.send(
            self.http.get(format!("{}{path}", self.base)),
            &format!("GET {path}"),
        )
        .await
    }

    pub async fn post<B: Serialize + ?Sized>(
        &self,
        path: &str,
        body: &B,
    ) -> anyhow::Result<(StatusCode, Value)> {
        self.send(
            self.http.post(format!("{}{path}", self.base)).json(body),
            &format!("POST {path}"),
        )
        .await
    }
}

/// A successful answer's body as its protocol type (`crate::protocol`).
pub fn decode<T: DeserializeOwned>(what: &str, body: Value) -> anyhow::Result<T> {
    serde_json::from_value(body).with_context(|| {
        format!("the hub's answer to {what} is not what this kernelize expects (are the hub and this client of the same version?)")
    })
}

/// The problem+json `detail` of an error answer, for messages.
pub fn problem(status: StatusCode, body: &Value) -> anyhow::Error {
    let detail = body["detail"].as_str().unwrap_or("(no detail)");
    anyhow!("the server answered {status}: {detail}")
}
