//! `kernelize worker`: a GPU worker. Claims verification jobs over HTTP with a lease,
//! heart-beats while the verifier runs, and posts the report. One worker per GPU, any number
//! of hosts.

use super::client::{decode, problem, Client};
use crate::protocol::{
    ClaimRequest, ClaimResponse, FailRequest, HeartbeatRequest, ReportRequest, ReportResponse,
};
use kernel_registry::report::ShapeRequest;
use kernel_registry::KernelBundle;
use reqwest::StatusCode;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Verify queued kernels on this machine's GPU for a hub.
#[derive(clap::Args, Debug, Clone)]
#[command(group = clap::ArgGroup::new("auth").required(true).multiple(false))]
pub struct WorkerArgs {
    /// The hub's URL.
    #[arg(long, env = "KERNELIZE_SERVER")]
    pub server: String,
    /// A token with scope `worker`.
    #[arg(long, env = "KERNELIZE_TOKEN", hide_env_values = true, group = "auth")]
    pub token: Option<String>,
    /// A file holding the token (as `kernelize token ensure --scope worker --file FILE` writes
    /// it), read at start: keeps the token out of the environment and the process list.
    #[arg(
        long,
        env = "KERNELIZE_TOKEN_FILE",
        value_name = "FILE",
        group = "auth"
    )]
    pub token_file: Option<std::path::PathBuf>,
    /// The worker's signing key (`kernelize worker-key init --file FILE` writes it): every
    /// report is sent with a certificate signed by it. Its public key must be registered on
    /// the hub (`kernelize worker-key register`).
    #[arg(long, env = "KERNELIZE_WORKER_KEY_FILE", value_name = "FILE")]
    pub key_file: Option<std::path::PathBuf>,
    /// The signing key itself (`serve --worker`'s embedded worker), instead of a file.
    #[arg(skip)]
    pub key: Option<ed25519_dalek::SigningKey>,
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
    #[command(flatten)]
    pub candidates: super::verify::PythonCandidateArgs,
}

/// Call before any thread starts: the verifier's sandbox processes inherit it.
pub fn select_gpu(gpu: Option<u32>) {
    if let Some(g) = gpu {
        std::env::set_var("CUDA_VISIBLE_DEVICES", g.to_string());
    }
}

impl WorkerArgs {
    /// The worker's token: `--token`, else the content of `--token-file`.
    pub fn token(&self) -> anyhow::Result<String> {
        match (&self.token, &self.token_file) {
            (Some(t), _) => Ok(t.clone()),
            (None, Some(f)) => crate::token_file::read(f),
            (None, None) => anyhow::bail!(
                "a worker needs a token with scope `worker`: pass --token T (or KERNELIZE_TOKEN) or --token-file FILE (or KERNELIZE_TOKEN_FILE)"
            ),
        }
    }
}

pub async fn run(a: WorkerArgs) -> anyhow::Result<ExitCode> {
    // The token first: a missing token file is a set-up error whatever the host.
    let token = a.token()?;
    if !verifier::gpu_available() {
        anyhow::bail!(
            "no usable CUDA GPU on this host: a worker needs one (libcuda.so.1 and a device)"
        );
    }
    // Checked once at start: a bad --model, a missing harness or an unreadable key is the
    // operator's to fix.
    let model = a.model.options_with(&a.candidates)?;
    let key = match (&a.key, &a.key_file) {
        (Some(k), _) => Some(k.clone()),
        (None, Some(f)) => Some(super::keys::read_signing_key(f)?),
        (None, None) => None,
    };
    match &key {
        Some(k) => tracing::info!(
            key_id = %kernel_registry::cert::key_id(&kernel_registry::cert::encode_key(&k.verifying_key())),
            "reports are signed"
        ),
        None => tracing::warn!(
            "no --key-file: reports are unsigned, and a hub stores them only when it runs with --accept-unsigned-reports"
        ),
    }
    let client = Client::new(&a.server, Some(token))?;
    // Declared at every claim: jobs queued for this architecture come here, and jobs of
    // kernels that do not run here go to other workers.
    let arch = verifier::device_info()
        .map(|d| d.arch)
        .map_err(|e| anyhow::anyhow!("reading this GPU's architecture: {e}"))?;
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "host".into());
    let name = format!("{host}/gpu{}/pid{}", a.gpu.unwrap_or(0), std::process::id());
    tracing::info!(server = client.base(), worker = %name, "worker started");
    let mut done = 0usize;
    loop {
        let (st, body) = client
            .post(
                "/v1/jobs/claim",
                &ClaimRequest {
                    worker: name.clone(),
                    arch: Some(arch),
                },
            )
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
            _ => return Err(problem(st, &body)),
        }
        let claim: ClaimResponse = decode("POST /v1/jobs/claim", body)?;
        let python = a.candidates.options(&a.model.python);
        run_job(
            &client,
            &claim,
            a.quick,
            model.as_ref(),
            &python,
            key.as_ref(),
        )
        .await?;
        done += 1;
    }
}

/// How the heartbeats ended.
const BEATING: u8 = 0;
/// The lease was lost (409) or is another token's (403): the job is no longer ours.
const LOST: u8 = 1;
/// The hub refused this worker's token (401: expired or revoked): stop working altogether.
const TOKEN_REFUSED: u8 = 2;

async fn run_job(
    client: &Client,
    claim: &ClaimResponse,
    quick: bool,
    model: Option<&verifier::model::ModelOptions>,
    python: &verifier::python::PythonOptions,
    key: Option<&ed25519_dalek::SigningKey>,
) -> anyhow::Result<()> {
    let id = claim.job.id;
    let lease = claim.lease_id.clone();
    let lease_ms = claim.lease_ms;
    let want = &claim.kernel.digest;
    let bundle = match KernelBundle::from_parts(&claim.kernel.manifest_toml, &claim.kernel.source) {
        Ok(b) if &b.digest() == want => b,
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
    let shapes: Vec<ShapeRequest> = claim.job.shapes.clone();
    let shown: Vec<String> = shapes.iter().map(|s| s.to_string()).collect();
    tracing::info!(job = id, kernel = %label, shapes = ?shown, "verifying");

    // Heartbeat while the verifier runs; a lost lease means another worker owns the job.
    let beat = Arc::new(AtomicU8::new(BEATING));
    let hb = {
        let (client, lease, beat) = (client.clone(), lease.clone(), beat.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis((lease_ms / 3).max(200) as u64)).await;
                let req = HeartbeatRequest {
                    lease_id: lease.clone(),
                };
                match client.post(&format!("/v1/jobs/{id}/heartbeat"), &req).await {
                    Ok((StatusCode::OK, _)) => {}
                    Ok((StatusCode::CONFLICT | StatusCode::FORBIDDEN, _)) => {
                        beat.store(LOST, Ordering::SeqCst);
                        return;
                    }
                    Ok((StatusCode::UNAUTHORIZED, body)) => {
                        tracing::error!(job = id, "{}", problem(StatusCode::UNAUTHORIZED, &body));
                        beat.store(TOKEN_REFUSED, Ordering::SeqCst);
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
        python: Some(python.clone()),
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
    match beat.load(Ordering::SeqCst) {
        LOST => {
            tracing::warn!(
                job = id,
                "lease lost while verifying; the result is dropped"
            );
            return Ok(());
        }
        TOKEN_REFUSED => anyhow::bail!(
            "the hub refused this worker's token while it verified job {id} (expired or revoked); start the worker with a valid token (`kernelize token create --scope worker`)"
        ),
        _ => {}
    }
    match result {
        Ok(report) => {
            // Bound to this job and this claim's nonce; a hub older than issue 26 hands out
            // no nonce and reads only unbound (/1) certificates.
            let certificate = key.map(|k| {
                let at = kernel_store::now_rfc3339();
                let claims = match &claim.nonce {
                    Some(nonce) => kernel_registry::cert::Claims::for_job(&report, &at, id, nonce),
                    None => kernel_registry::cert::Claims::of(&report, &at),
                };
                kernel_registry::cert::Certificate::sign(k, &claims)
            });
            let req = ReportRequest {
                lease_id: lease.clone(),
                report,
                certificate,
            };
            let (st, body) = client.post(&format!("/v1/jobs/{id}/report"), &req).await?;
            // Refused for its certificate (no key, an unregistered or revoked one, or one the
            // hub does not take as bound to this job): every report of this worker would be, so
            // it stops rather than spend the queue's attempts; the job's lease runs out and
            // another worker takes it.
            if st.is_client_error() && body["field"] == "certificate" {
                return Err(problem(st, &body).context(
                    "the hub refused this worker's report for its certificate; give the worker a registered key (`kernelize worker-key init --file KEY`, `kernelize worker-key register --key-file KEY` on the hub's database, then `kernelize worker --key-file KEY`), and run the worker of the hub's release (it signs certificates bound to the job and its claim)",
                ));
            }
            match st {
                StatusCode::CREATED => {
                    let r: ReportResponse = decode("POST /v1/jobs/{id}/report", body)?;
                    println!(
                        "job {id} {label}: {} (verification {})",
                        r.class, r.verification_id
                    );
                    Ok(())
                }
                StatusCode::UNAUTHORIZED => Err(problem(st, &body).context(
                    "the hub refused this worker's token (expired or revoked); start the worker with a valid token",
                )),
                // The hub found the report impossible for this job: say why on the job, so
                // that it does not wait out the lease.
                StatusCode::UNPROCESSABLE_ENTITY => {
                    let why = problem(st, &body);
                    tracing::warn!(job = id, "report refused: {why}");
                    fail(client, id, &lease, &format!("the hub refused the report: {why}")).await
                }
                _ => {
                    tracing::warn!(job = id, "report refused: {}", problem(st, &body));
                    Ok(())
                }
            }
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
    let req = FailRequest {
        lease_id: lease.to_string(),
        reason: reason.to_string(),
    };
    let (st, body) = client.post(&format!("/v1/jobs/{id}/fail"), &req).await?;
    match st {
        StatusCode::OK => Ok(()),
        StatusCode::UNAUTHORIZED => Err(problem(st, &body).context(
            "the hub refused this worker's token (expired or revoked); start the worker with a valid token",
        )),
        _ => {
            tracing::warn!(
                job = id,
                "could not record the failure: {}",
                problem(st, &body)
            );
            Ok(())
        }
    }
}
