//! `kernelize submit`: a kernel author's CI uploads a kernel and, with `--wait`, gates on its
//! verdict.

use super::client::{decode, problem, Client};
use crate::protocol::{JobView, SubmitResponse, VerificationRecord};
use anyhow::Context;
use kernel_registry::report::VerificationReport;
use kernel_registry::{DType, KernelBundle, Policy};
use kernel_store::JobState;
use reqwest::StatusCode;
use serde_json::json;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Upload a kernel folder to a hub and print its digest and verification job.
#[derive(clap::Args, Debug)]
pub struct SubmitArgs {
    /// The kernel's folder (kernel.toml and its .cu source).
    pub dir: PathBuf,
    /// The hub's URL.
    #[arg(long, env = "KERNELIZE_SERVER")]
    pub server: String,
    /// A token with scope `submit` (`submit-python` for a Python candidate).
    #[arg(long, env = "KERNELIZE_TOKEN", hide_env_values = true)]
    pub token: String,
    /// Wait for the verdict of a GPU worker and print it.
    #[arg(long)]
    pub wait: bool,
    /// With --wait: exit non-zero unless the verdict meets this policy (e.g. bit_exact, ulp:2, tolerance).
    #[arg(long, requires = "wait", value_parser = super::verify::one_report_policy)]
    pub policy: Option<Policy>,
    /// With --policy: the dtype the policy must hold for (default: every dtype of the kernel).
    #[arg(long, requires = "policy")]
    pub dtype: Option<DType>,
    /// With --wait: give up after this many seconds.
    #[arg(long, default_value_t = 1800)]
    pub timeout: u64,
}

pub async fn run(a: SubmitArgs) -> anyhow::Result<ExitCode> {
    // Check locally first: field errors are cheaper here than after an upload.
    let bundle = KernelBundle::load_dir(&a.dir)?;
    let client = Client::new(&a.server, Some(a.token.clone()))?;
    let (st, body) = client
        .post(
            "/v1/kernels",
            &json!({"manifest": bundle.manifest_toml, "source": bundle.source}),
        )
        .await?;
    if !(st == StatusCode::CREATED || st == StatusCode::OK) {
        return Err(problem(st, &body));
    }
    let r: SubmitResponse = decode("POST /v1/kernels", body)?;
    let job_id = r.job.as_ref().map(|j| j.id);
    println!(
        "{} {} {}  digest {}",
        if r.created {
            "submitted"
        } else {
            "already stored"
        },
        bundle.manifest.name,
        bundle.manifest.version,
        r.digest
    );
    if let Some(id) = job_id {
        println!("verification job {id}: {}/v1/jobs/{id}", client.base());
    }
    if !a.wait {
        return Ok(ExitCode::SUCCESS);
    }
    let id = job_id.context("the server returned no verification job to wait for")?;
    let report = wait_for(&client, id, Duration::from_secs(a.timeout)).await?;
    let Some(report) = report else {
        return Ok(ExitCode::FAILURE);
    };
    print_verdict(&report);
    let Some(policy) = a.policy else {
        return Ok(ExitCode::SUCCESS);
    };
    let dtypes: Vec<DType> = match a.dtype {
        Some(d) => vec![d],
        None => bundle.manifest.dtypes(),
    };
    let mut ok = true;
    for d in dtypes {
        match policy.evaluate(&report, d) {
            Ok(()) => println!("policy {policy} holds for {d}"),
            Err(why) => {
                ok = false;
                println!("policy {policy} FAILS for {d}:");
                for w in why {
                    println!("  - {w}");
                }
            }
        }
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Poll a job until it is done (the report) or failed (`None`, reason printed).
async fn wait_for(
    client: &Client,
    id: i64,
    timeout: Duration,
) -> anyhow::Result<Option<VerificationReport>> {
    let bar = indicatif::ProgressBar::new_spinner();
    bar.enable_steady_tick(Duration::from_millis(200));
    let start = Instant::now();
    loop {
        let (st, body) = client.get(&format!("/v1/jobs/{id}")).await?;
        if st != StatusCode::OK {
            bar.finish_and_clear();
            return Err(problem(st, &body));
        }
        let job = decode::<JobView>("GET /v1/jobs/{id}", body)?.job;
        let state = job.state;
        bar.set_message(format!(
            "job {id}: {state} (attempt {} of {}), {:.0} s",
            job.attempts,
            job.max_attempts,
            start.elapsed().as_secs_f64()
        ));
        match state {
            JobState::Done => {
                bar.finish_and_clear();
                let vid = job
                    .verification_id
                    .context("done job without verification")?;
                let (st, v) = client.get(&format!("/v1/verifications/{vid}")).await?;
                if st != StatusCode::OK {
                    return Err(problem(st, &v));
                }
                let v: VerificationRecord = decode("GET /v1/verifications/{id}", v)?;
                return Ok(Some(v.report));
            }
            JobState::Failed => {
                bar.finish_and_clear();
                println!(
                    "verification job {id} FAILED: {}",
                    job.last_error.as_deref().unwrap_or("no reason recorded")
                );
                return Ok(None);
            }
            JobState::Queued | JobState::Running => {}
        }
        if start.elapsed() > timeout {
            bar.finish_and_clear();
            anyhow::bail!(
                "no verdict within {} s (job {id} is {state}); is a GPU worker running? (`kernelize worker --server ... --token ...`)",
                timeout.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

fn print_verdict(r: &VerificationReport) {
    println!(
        "verdict on {} ({}, driver {}, CUDA {}), seed {}:",
        r.device.name, r.device.arch, r.device.driver_version, r.device.cuda_version, r.seed
    );
    for (d, v) in &r.summary.per_dtype {
        let speed = v
            .gbps_4096x8192
            .map(|g| format!(", {g:.0} GB/s at 4096x8192"))
            .unwrap_or_default();
        println!("  {d}: {} — {}{speed}", v.class, v.describe());
    }
}
