//! `kernelize worker`: a GPU worker. Claims verification jobs over HTTP with a lease,
//! heart-beats while the verifier runs, and posts the report. One worker per GPU, any number
//! of hosts.

use super::client::{problem, Client};
use anyhow::Context;
use kernel_registry::report::ShapeRequest;
use kernel_registry::{Digest, KernelBundle};
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Verify queued kernels on this machine's GPU for a hub.
#[derive(clap::Args, Debug, Clone)]
pub struct WorkerArgs {
    /// The hub's URL.
    #[arg(long, env = "KERNELIZE_SERVER")]
    pub server: String,
    /// A token with scope `worker`.
    #[arg(long, env = "KERNELIZE_TOKEN", hide_env_values = true)]
    pub token: String,
    /// Which GPU of this host to use (sets CUDA_VISIBLE_DEVICES for the verifier).
    #[arg(long)]
    pub gpu: Option<u32>,
    /// Verify the jobs waiting now, then exit (default: keep polling).
    #[arg(long)]
    pub drain: bool,
    /// Run the smaller suite (for smoke tests; the verdict says quick).
    #[arg(long)]
    pub quick: bool,
    /// Seconds between polls when no job is waiting.
    #[arg(long, default_value_t = 5)]
    pub poll_seconds: u64,
    #[command(flatten)]
    pub model: super::verify::ModelArgs,
}

/// Call before any thread starts: the verifier's sandbox processes inherit it.
pub fn select_gpu(gpu: Option<u32>) {
    if let Some(g) = gpu {
        std::env::set_var("CUDA_VISIBLE_DEVICES", g.to_string());
    }
}

pub async fn run(a: WorkerArgs) -> anyhow::Result<ExitCode> {
    if !verifier::gpu_available() {
        anyhow::bail!(
            "no usable CUDA GPU on this host: a worker needs one (libcuda.so.1 and a device)"
        );
    }
    // Checked once at start: a bad --model or a missing harness is the operator's to fix.
    let model = a.model.options()?;
    let client = Client::new(&a.server, Some(a.token.clone()))?;
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "host".into());
    let name = format!("{host}/gpu{}/pid{}", a.gpu.unwrap_or(0), std::process::id());
    tracing::info!(server = client.base(), worker = %name, "worker started");
    let mut done = 0usize;
    loop {
        let (st, claim) = client
            .post("/v1/jobs/claim", &json!({"worker": name}))
            .await?;
        match st {
            StatusCode::NO_CONTENT => {
                if a.drain {
                    println!("no job waiting; verified {done} job(s)");
                    return Ok(ExitCode::SUCCESS);
                }
                tokio::time::sleep(Duration::from_secs(a.poll_seconds.max(1))).await;
                continue;
            }
            StatusCode::OK => {}
            _ => return Err(problem(st, &claim)),
        }
        run_job(&client, &claim, a.quick, model.as_ref()).await?;
        done += 1;
    }
}

async fn run_job(
    client: &Client,
    claim: &Value,
    quick: bool,
    model: Option<&verifier::model::ModelOptions>,
) -> anyhow::Result<()> {
    let id = claim["job"]["id"]
        .as_i64()
        .context("claim without job id")?;
    let lease = claim["lease_id"]
        .as_str()
        .context("claim without lease")?
        .to_string();
    let lease_ms = claim["lease_ms"].as_i64().unwrap_or(120_000);
    let want: Digest = claim["kernel"]["digest"]
        .as_str()
        .unwrap_or("")
        .parse()
        .context("claim with a bad digest")?;
    let bundle = KernelBundle::from_parts(
        claim["kernel"]["manifest_toml"].as_str().unwrap_or(""),
        claim["kernel"]["source"].as_str().unwrap_or(""),
    );
    let bundle = match bundle {
        Ok(b) if b.digest() == want => b,
        Ok(b) => {
            let reason = format!(
                "the served kernel hashes to {} instead of {want}",
                b.digest()
            );
            return fail(client, id, &lease, &reason).await;
        }
        Err(e) => {
            return fail(
                client,
                id,
                &lease,
                &format!("the served kernel is invalid: {e}"),
            )
            .await
        }
    };
    let label = format!("{} {}", bundle.manifest.name, bundle.manifest.version);
    // Widths to verify besides the suite (a job /v1/resolve queued for an unverified width):
    // the whole suite runs too, so the report stands on its own.
    let shapes: Vec<ShapeRequest> = match claim["job"].get("shapes") {
        None | Some(Value::Null) => vec![],
        Some(v) => match serde_json::from_value(v.clone()) {
            Ok(s) => s,
            Err(e) => {
                return fail(
                    client,
                    id,
                    &lease,
                    &format!("the job's shape list is invalid: {e}"),
                )
                .await
            }
        },
    };
    let shown: Vec<String> = shapes.iter().map(|s| s.to_string()).collect();
    tracing::info!(job = id, kernel = %label, shapes = ?shown, "verifying");

    // Heartbeat while the verifier runs; a lost lease means another worker owns the job.
    let lost = Arc::new(AtomicBool::new(false));
    let hb = {
        let (client, lease, lost) = (client.clone(), lease.clone(), lost.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis((lease_ms / 3).max(200) as u64)).await;
                match client
                    .post(
                        &format!("/v1/jobs/{id}/heartbeat"),
                        &json!({"lease_id": lease}),
                    )
                    .await
                {
                    Ok((StatusCode::OK, _)) => {}
                    Ok((StatusCode::CONFLICT, _)) => {
                        lost.store(true, Ordering::SeqCst);
                        return;
                    }
                    // A passing network fault: try again at the next beat.
                    other => tracing::warn!(job = id, ?other, "heartbeat failed"),
                }
            }
        })
    };
    let opts = verifier::VerifyOptions {
        quick,
        shapes: shapes.clone(),
        ..Default::default()
    };
    let model = model.cloned();
    let result = tokio::task::spawn_blocking(move || {
        let mut report =
            verifier::verify_bundle(&bundle, &opts, &mut |p: &verifier::Progress| {
                if p.outcome.is_some() && (p.done.is_multiple_of(10) || p.done == p.total) {
                    tracing::info!(job = id, done = p.done, total = p.total, case = %p.case_id, "progress");
                }
            })?;
        if report.requested_shapes.is_empty() {
            // What was asked, recorded even by a verifier that does not record it itself.
            report.requested_shapes = shapes;
        }
        if let Some(mo) = &model {
            // A harness failure is recorded in the report's model notes; the case results
            // still stand and are posted.
            if let Err(e) = verifier::model::attach(&mut report, &bundle, mo, &mut |l| {
                tracing::info!(job = id, "{l}")
            }) {
                tracing::warn!(job = id, "model-level run failed: {e}");
            }
        }
        Ok::<_, verifier::VerifyError>(report)
    })
    .await?;
    hb.abort();
    if lost.load(Ordering::SeqCst) {
        tracing::warn!(
            job = id,
            "lease lost while verifying; the result is dropped"
        );
        return Ok(());
    }
    match result {
        Ok(report) => {
            let class = report.summary.overall.class;
            let (st, r) = client
                .post(
                    &format!("/v1/jobs/{id}/report"),
                    &json!({"lease_id": lease, "report": report}),
                )
                .await?;
            if st == StatusCode::CREATED {
                println!(
                    "job {id} {label}: {class} (verification {})",
                    r["verification_id"]
                );
            } else {
                tracing::warn!(job = id, "report refused: {}", problem(st, &r));
            }
            Ok(())
        }
        Err(verifier::VerifyError::NoGpu(m)) => {
            fail(
                client,
                id,
                &lease,
                &format!("worker has no usable GPU: {m}"),
            )
            .await?;
            anyhow::bail!("the GPU became unusable: {m}")
        }
        Err(e) => fail(client, id, &lease, &e.to_string()).await,
    }
}

async fn fail(client: &Client, id: i64, lease: &str, reason: &str) -> anyhow::Result<()> {
    tracing::warn!(job = id, reason, "job failed on this worker");
    let (st, r) = client
        .post(
            &format!("/v1/jobs/{id}/fail"),
            &json!({"lease_id": lease, "reason": reason}),
        )
        .await?;
    if st != StatusCode::OK {
        tracing::warn!(
            job = id,
            "could not record the failure: {}",
            problem(st, &r)
        );
    }
    Ok(())
}
