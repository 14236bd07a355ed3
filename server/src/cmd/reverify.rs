//! `kernelize verify-request`: queue verifications of stored kernels on an architecture, for a
//! new GPU, driver or suite (an admin's or CI's command; the hub's `POST
//! /v1/kernels/{name}/{version}/verify`).

use super::client::{problem, Client};
use kernel_registry::Arch;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::process::ExitCode;

/// Queue a verification of a kernel (or, with --stale, of every kernel whose newest verdict on
/// the architecture is stale) on an architecture: a worker of that architecture runs the suite.
#[derive(clap::Args, Debug)]
#[command(
    group = clap::ArgGroup::new("what").required(true).args(["kernel", "stale"]),
    after_help = "Examples:\n  kernelize verify-request rms_norm_llama 1.0.2 --arch sm_100 --reason \"new GPUs\" --server URL --token ADMIN\n  kernelize verify-request --stale --arch sm_90 --reason \"driver 590\" --server URL --token ADMIN"
)]
pub struct VerifyRequestArgs {
    /// The kernel: NAME VERSION.
    #[arg(num_args = 2, value_names = ["NAME", "VERSION"])]
    pub kernel: Vec<String>,
    /// Every kernel whose newest verdict on --arch is stale (an older suite or another driver
    /// than the newest one seen there), or that has none there while another architecture has.
    #[arg(long)]
    pub stale: bool,
    /// The architecture to verify on (e.g. sm_90).
    #[arg(long)]
    pub arch: Arch,
    /// Why, for the audit log.
    #[arg(long)]
    pub reason: Option<String>,
    /// The hub's URL.
    #[arg(long, env = "KERNELIZE_SERVER")]
    pub server: String,
    /// A token with scope `admin`.
    #[arg(long, env = "KERNELIZE_TOKEN", hide_env_values = true)]
    pub token: String,
}

pub async fn run(a: VerifyRequestArgs) -> anyhow::Result<ExitCode> {
    let client = Client::new(&a.server, Some(a.token.clone()))?;
    let targets: Vec<(String, String, String)> = if a.stale {
        stale_kernels(&client, a.arch).await?
    } else {
        vec![(
            a.kernel[0].clone(),
            a.kernel[1].clone(),
            a.reason.clone().unwrap_or_else(|| "requested".into()),
        )]
    };
    if targets.is_empty() {
        println!(
            "no kernel has a stale verdict on {}; nothing queued",
            a.arch
        );
        return Ok(ExitCode::SUCCESS);
    }
    let mut failed = 0;
    for (name, version, why) in &targets {
        let why = match (&a.reason, a.stale) {
            (Some(r), true) => format!("{r}: {why}"),
            _ => why.clone(),
        };
        let (st, body) = client
            .post(
                &format!("/v1/kernels/{name}/{version}/verify"),
                &json!({"arch": a.arch, "reason": why}),
            )
            .await?;
        match st {
            StatusCode::CREATED | StatusCode::OK => println!(
                "{name} {version} on {}: job {} {} ({})",
                a.arch,
                body["job"]["id"],
                if st == StatusCode::CREATED {
                    "queued"
                } else {
                    "already pending"
                },
                why
            ),
            _ => {
                failed += 1;
                eprintln!("{name} {version}: {:#}", problem(st, &body));
            }
        }
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// (name, version, why) of every kernel whose newest verdict on `arch` is stale, as the hub
/// lists them (`GET /v1/kernels?arch=A&stale=true`, a page of 500 at a time).
async fn stale_kernels(
    client: &Client,
    arch: Arch,
) -> anyhow::Result<Vec<(String, String, String)>> {
    let mut out = Vec::new();
    let mut offset = 0;
    loop {
        let (st, page) = client
            .get(&format!(
                "/v1/kernels?arch={arch}&stale=true&limit=500&offset={offset}"
            ))
            .await?;
        if st != StatusCode::OK {
            return Err(problem(st, &page));
        }
        for k in page["kernels"].as_array().into_iter().flatten() {
            let why: Vec<&str> = k["stale"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            out.push((
                k["name"].as_str().unwrap_or_default().to_string(),
                k["version"].as_str().unwrap_or_default().to_string(),
                why.join("; "),
            ));
        }
        match page["next_offset"].as_i64() {
            Some(n) => offset = n,
            None => break,
        }
    }
    Ok(out)
}
