//! A small HTTP client of the kernelize API, shared by `submit` and `worker`.

use anyhow::{anyhow, Context};
use reqwest::StatusCode;
use serde_json::Value;

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
        let r = req.send().await.with_context(|| {
            format!(
                "{what}: cannot reach {} (is `kernelize serve` running there?)",
                self.base
            )
        })?;
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

    pub async fn post(&self, path: &str, body: &Value) -> anyhow::Result<(StatusCode, Value)> {
        self.send(
            self.http.post(format!("{}{path}", self.base)).json(body),
            &format!("POST {path}"),
        )
        .await
    }
}

/// The problem+json `detail` of an error answer, for messages.
pub fn problem(status: StatusCode, body: &Value) -> anyhow::Error {
    let detail = body["detail"].as_str().unwrap_or("(no detail)");
    anyhow!("the server answered {status}: {detail}")
}
