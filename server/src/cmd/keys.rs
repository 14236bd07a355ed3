//! Worker keys and certificates: `kernelize worker-key init|register|list` and
//! `kernelize cert verify`.
//!
//! A worker signs each report with its own ed25519 key (`worker-key init` writes it, mode
//! 0600); an admin registers the public key on the hub's database (`worker-key register`); the
//! hub stores a signed report only when its certificate verifies against a registered key, and
//! serves the certificate with the verification. Anyone can then check a verification offline
//! with `cert verify`, trusting the public keys they choose.

use anyhow::Context;
use clap::Subcommand;
use ed25519_dalek::SigningKey;
use kernel_registry::cert::{self, Certificate};
use kernel_registry::report::VerificationReport;
use kernel_registry::KernelBundle;
use kernel_store::Store;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Subcommand, Debug)]
pub enum WorkerKeyCommand {
    /// Create a worker's signing key in FILE (mode 0600) and print its public key, which an
    /// admin registers on the hub. An existing key is kept (its public key printed again).
    Init {
        /// Where to keep the secret key (give the worker `--key-file FILE`).
        #[arg(long, value_name = "FILE")]
        file: PathBuf,
    },
    /// Register a worker's public key on the hub's database, under a name shown in the audit
    /// log: reports signed by it are accepted from then on.
    Register {
        /// A name for the key (the host and GPU, say); default `worker-KEYID`.
        #[arg(long)]
        name: Option<String>,
        /// The public key as `worker-key init` printed it.
        #[arg(
            long,
            required_unless_present = "key_file",
            conflicts_with = "key_file"
        )]
        public_key: Option<String>,
        /// Or the worker's key file, whose public key is registered.
        #[arg(long, value_name = "FILE")]
        key_file: Option<PathBuf>,
        #[command(flatten)]
        db: crate::cmd::db::DbArgs,
    },
    /// Revoke a worker key (by name or id): reports it signs are refused from then on;
    /// verifications already stored keep their certificates.
    Revoke {
        /// The key's name or id (`worker-key list`).
        key: String,
        #[command(flatten)]
        db: crate::cmd::db::DbArgs,
    },
    /// List the registered worker keys.
    List {
        #[command(flatten)]
        db: crate::cmd::db::DbArgs,
    },
}

#[derive(Subcommand, Debug)]
pub enum CertCommand {
    /// Sign a verification report with a worker key, for a report made elsewhere (`kernelize
    /// verify --json FILE` on a GPU host) and posted by other means: prints the JSON
    /// `{"report": ..., "certificate": ...}`. With --job and --nonce (the claim's), the
    /// certificate is bound to that job and claim, as a job's report needs; without them it is
    /// bound to none (format /1), which a hub accepts only as a bundled certificate it imports.
    /// The summary is first derived from the cases, as the hub derives it (the hub stores what
    /// was signed).
    Sign {
        /// The report (JSON, as `kernelize verify --json` writes it).
        report: PathBuf,
        /// The worker key (`kernelize worker-key init --file FILE`).
        #[arg(long, value_name = "FILE")]
        key_file: PathBuf,
        /// The id of the job the report answers (the claim's `job.id`).
        #[arg(long, value_name = "ID", requires = "nonce", value_parser = clap::value_parser!(i64).range(1..))]
        job: Option<i64>,
        /// The nonce the hub handed out with the claim (the claim's `nonce`).
        #[arg(long, value_name = "NONCE", requires = "job")]
        nonce: Option<String>,
    },
    /// Check a verification's certificate offline: the signature, that the signer is one of
    /// the keys you trust, that it certifies this very report (every figure), and with
    /// --kernel that the kernel folder is the one verified. Exit 0 when all hold.
    Verify {
        /// A verification as the hub serves it (`GET /v1/verifications/{id}`): JSON with
        /// `report` and `certificate`.
        file: PathBuf,
        /// A public key you trust (base64, as `worker-key init` prints it). Repeatable.
        #[arg(
            long = "trust",
            value_name = "KEY",
            required_unless_present = "trust_file"
        )]
        trust: Vec<String>,
        /// A file of trusted public keys, one per line (`#` starts a comment).
        #[arg(long, value_name = "FILE")]
        trust_file: Option<PathBuf>,
        /// A kernel folder (kernel.toml and its source) that must be the kernel certified.
        #[arg(long, value_name = "DIR")]
        kernel: Option<PathBuf>,
    },
}

/// A new signing key from the operating system's random source.
fn new_signing_key() -> SigningKey {
    let mut secret = [0u8; 32];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut secret);
    SigningKey::from_bytes(&secret)
}

/// `serve --worker`'s key: the one in `path` (created, mode 0600, when missing; `None`: an
/// in-memory database, a key for this process only), registered on `store` as `embedded-...`
/// unless it is already; a key revoked on this database is replaced by a new one.
pub async fn ensure_registered_key(
    store: &Store,
    path: Option<&Path>,
) -> anyhow::Result<SigningKey> {
    let mut key = match path {
        Some(p) if p.exists() => read_signing_key(p)?,
        _ => new_signing_key(),
    };
    let public = |k: &SigningKey| cert::encode_key(&k.verifying_key());
    if let Some(k) = store.worker_key(&public(&key)).await? {
        if k.revoked_at.is_none() {
            return Ok(key);
        }
        tracing::warn!(name = %k.name, "the embedded worker's key was revoked; making a new one");
        key = new_signing_key();
    }
    if let Some(p) = path {
        crate::token_file::write_private(p, &cert::encode_signing_key(&key))?;
    }
    let name = format!("embedded-worker-{}", cert::key_id(&public(&key)));
    store
        .register_worker_key(&name, &public(&key), "system")
        .await?;
    tracing::info!(%name, file = ?path, "embedded worker key registered");
    Ok(key)
}

/// The signing key in `path` (as `worker-key init` wrote it).
pub fn read_signing_key(path: &Path) -> anyhow::Result<SigningKey> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!(
            "reading the worker key {} (create one with `kernelize worker-key init --file {}`)",
            path.display(),
            path.display()
        )
    })?;
    cert::decode_signing_key(&text)
        .with_context(|| format!("the worker key file {} is not a key", path.display()))
}

pub async fn worker_key(c: WorkerKeyCommand) -> anyhow::Result<ExitCode> {
    match c {
        WorkerKeyCommand::Init { file } => {
            let key = if file.exists() {
                let k = read_signing_key(&file)?;
                eprintln!("{} holds a key already; kept", file.display());
                k
            } else {
                let k = new_signing_key();
                crate::token_file::write_private(&file, &cert::encode_signing_key(&k))?;
                eprintln!(
                    "worker key written to {} (mode 0600); register its public key on the hub:",
                    file.display()
                );
                k
            };
            let public = cert::encode_key(&key.verifying_key());
            eprintln!("  kernelize worker-key register --name NAME --public-key {public}");
            println!("{public}");
            Ok(ExitCode::SUCCESS)
        }
        WorkerKeyCommand::Register {
            name,
            public_key,
            key_file,
            db,
        } => {
            let public = match (public_key, key_file) {
                (Some(p), _) => {
                    cert::decode_key(&p).with_context(|| format!("--public-key {p}"))?;
                    p.trim().to_string()
                }
                (None, Some(f)) => cert::encode_key(&read_signing_key(&f)?.verifying_key()),
                (None, None) => anyhow::bail!("give --public-key KEY or --key-file FILE"),
            };
            let name = name.unwrap_or_else(|| format!("worker-{}", cert::key_id(&public)));
            let store = Store::open(&db.db).await?;
            let registered = store.register_worker_key(&name, &public, "admin").await;
            store.close().await;
            let k = registered?;
            if let Some(at) = &k.revoked_at {
                anyhow::bail!(
                    "worker key `{}` was revoked at {at}; make a new key (`kernelize worker-key init --file NEW`) and register that",
                    k.name
                );
            }
            eprintln!(
                "worker key `{}` registered (id {}, key id {})",
                k.name,
                k.id,
                cert::key_id(&k.public_key)
            );
            Ok(ExitCode::SUCCESS)
        }
        WorkerKeyCommand::Revoke { key, db } => {
            let store = Store::open(&db.db).await?;
            let revoked = store.revoke_worker_key(&key, "admin").await;
            store.close().await;
            let k = revoked?;
            eprintln!(
                "worker key `{}` (id {}) revoked at {}",
                k.name,
                k.id,
                k.revoked_at.as_deref().unwrap_or("?")
            );
            Ok(ExitCode::SUCCESS)
        }
        WorkerKeyCommand::List { db } => {
            let store = Store::open(&db.db).await?;
            let keys = store.worker_keys().await;
            store.close().await;
            println!(
                "{:<5} {:<24} {:<17} {:<26} public key",
                "id", "name", "key id", "registered"
            );
            for k in keys? {
                let state = match &k.revoked_at {
                    Some(at) => format!("  (revoked {at})"),
                    None => String::new(),
                };
                println!(
                    "{:<5} {:<24} {:<17} {:<26} {}{state}",
                    k.id,
                    k.name,
                    cert::key_id(&k.public_key),
                    k.created_at,
                    k.public_key
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

pub fn cert_command(c: CertCommand) -> anyhow::Result<ExitCode> {
    let (file, mut trust, trust_file, kernel) = match c {
        CertCommand::Sign {
            report,
            key_file,
            job,
            nonce,
        } => return sign(&report, &key_file, job.zip(nonce)),
        CertCommand::Verify {
            file,
            trust,
            trust_file,
            kernel,
        } => (file, trust, trust_file, kernel),
    };
    if let Some(f) = &trust_file {
        let text = std::fs::read_to_string(f)
            .with_context(|| format!("reading the trusted keys {}", f.display()))?;
        trust.extend(cert::parse_key_list(&text));
    }
    for k in &trust {
        cert::decode_key(k).with_context(|| format!("trusted key `{k}`"))?;
    }
    let text =
        std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", file.display()))?;
    let Some(c) = v.get("certificate").filter(|c| !c.is_null()) else {
        anyhow::bail!(
            "{} has no certificate: the worker that verified it did not sign its report",
            file.display()
        );
    };
    let certificate: Certificate = serde_json::from_value(c.clone())
        .with_context(|| format!("the certificate in {}", file.display()))?;
    let report: VerificationReport = serde_json::from_value(v["report"].clone())
        .with_context(|| format!("the report in {}", file.display()))?;
    let claims = certificate
        .verify(&trust)
        .and_then(|claims| claims.check_report(&report).map(|_| claims))
        .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    if let Some(dir) = &kernel {
        let bundle = KernelBundle::load_dir(dir)
            .with_context(|| format!("reading the kernel folder {}", dir.display()))?;
        claims
            .check_kernel(&bundle.digest())
            .map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
    }
    println!(
        "certificate OK: {} ({}) {} on {} ({}), driver {}, CUDA {}, suite {}, signed by key {} at {}{}{}",
        claims.kernel,
        claims.kernel_digest,
        claims.class,
        claims.device,
        claims.arch,
        claims.driver_version,
        claims.cuda_version,
        claims.suite_version,
        certificate.key_id(),
        claims.signed_at,
        claims
            .job_id
            .map(|j| format!(", for job {j} (bound to its claim's nonce)"))
            .unwrap_or_default(),
        if kernel.is_some() { "; the kernel folder is the one certified" } else { "" }
    );
    Ok(ExitCode::SUCCESS)
}

fn sign(report: &Path, key_file: &Path, job: Option<(i64, String)>) -> anyhow::Result<ExitCode> {
    let key = read_signing_key(key_file)?;
    let text = std::fs::read_to_string(report)
        .with_context(|| format!("reading the report {}", report.display()))?;
    let mut r: VerificationReport = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a verification report", report.display()))?;
    let changed = kernel_registry::report::rederive(&mut r);
    if !changed.is_empty() {
        eprintln!(
            "the summary was re-derived from the cases ({}); the signed report holds the derived one",
            changed.join(", ")
        );
    }
    let at = kernel_store::now_rfc3339();
    let claims = match &job {
        Some((id, nonce)) => cert::Claims::for_job(&r, &at, *id, nonce),
        None => cert::Claims::of(&r, &at),
    };
    let certificate = Certificate::sign(&key, &claims);
    println!(
        "{}",
        serde_json::json!({"report": r, "certificate": certificate})
    );
    Ok(ExitCode::SUCCESS)
}
