//! `kernelize health`: a health probe for containers (Docker `HEALTHCHECK`, compose
//! `healthcheck`): the hub answers `/healthz`, and with `--gpu` this host has a usable GPU.

use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args, Debug, Clone)]
pub struct HealthArgs {
    /// The hub's URL (for the hub's own container: the address it serves on, e.g.
    /// http://127.0.0.1:8080).
    #[arg(
        long,
        env = "KERNELIZE_SERVER",
        default_value = "http://127.0.0.1:8080"
    )]
    pub server: String,
    /// Also require a usable CUDA GPU on this host (a worker's container).
    #[arg(long)]
    pub gpu: bool,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 5)]
    pub timeout_seconds: u64,
}

pub async fn run(a: HealthArgs) -> anyhow::Result<ExitCode> {
    let base = a.server.trim_end_matches('/');
    if !(base.starts_with("http://") || base.starts_with("https://")) {
        anyhow::bail!(
            "--server `{}` must be an http:// or https:// URL, e.g. http://127.0.0.1:8080",
            a.server
        );
    }
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(a.timeout_seconds.max(1)))
        .build()?;
    let url = format!("{base}/healthz");
    let answer = match http.get(&url).send().await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("unhealthy: GET {url} failed: {e}");
            return Ok(ExitCode::FAILURE);
        }
    };
    let status = answer.status();
    let body: serde_json::Value = answer.json().await.unwrap_or_default();
    if !status.is_success() || body["status"] != "ok" {
        eprintln!("unhealthy: GET {url} answered {status}: {body}");
        return Ok(ExitCode::FAILURE);
    }
    if a.gpu && !verifier::gpu_available() {
        eprintln!("unhealthy: no usable CUDA GPU (libcuda.so.1 and a device) in this container");
        return Ok(ExitCode::FAILURE);
    }
    println!("healthy: {url} answered {status}");
    Ok(ExitCode::SUCCESS)
}
