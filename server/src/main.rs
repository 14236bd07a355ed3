//! `kernelize`: the kernel hub's one binary. Each subcommand is a process role.

use anyhow::Context;
use clap::{Parser, Subcommand};
use kernel_registry::storage::{Store, DEFAULT_DB_URL};
use kernelize::app::{app, AppState, Config, Scope};
use kernelize::cmd;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Parser, Debug)]
#[command(
    name = "kernelize",
    version,
    about = "A kernel hub that hands out only verified GPU layer replacements",
    long_about = "kernelize stores candidate CUDA kernels (RMSNorm, LayerNorm, SiLU, ...), verifies \
each on a real GPU against reference layers and an f64 oracle, and hands a client only kernels \
whose measured exactness meets its policy.\n\nStart the hub:   kernelize serve\nVerify a kernel: kernelize verify kernels/rms_norm_llama --policy bit_exact\nSubmit from CI:  kernelize submit DIR --server URL --token T --wait --policy bit_exact",
    after_help = "Storage: --db sqlite://PATH (default, created on first run) or postgres://USER@HOST:PORT/DB.\nEnvironment: KERNELIZE_DB, KERNELIZE_SERVER, KERNELIZE_TOKEN, RUST_LOG."
)]
struct Cli {
    /// Log as JSON lines instead of text.
    #[arg(long, global = true)]
    log_json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the HTTP service (API + dashboard), migrating the database and loading bundled kernels.
    Serve(ServeArgs),
    /// Create or upgrade the database schema, then exit.
    Migrate(DbArgs),
    /// Manage API tokens.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Verify a kernel folder on this machine's GPU and print the verdict.
    Verify(cmd::verify::VerifyArgs),
    /// Print this machine's GPU, driver, CUDA version and measured copy bandwidth.
    Device(cmd::verify::DeviceArgs),
    /// Upload a kernel folder to a hub (for a kernel author's CI); --wait gates on the verdict.
    Submit(cmd::submit::SubmitArgs),
    /// Verify queued kernels on this host's GPU for a hub (one worker per GPU).
    Worker(cmd::worker::WorkerArgs),
    #[command(name = "__sandbox", hide = true)]
    Sandbox(cmd::verify::SandboxArgs),
    /// Internal: compare the built-in reference layers with PyTorch eager outputs.
    #[command(name = "__conformance", hide = true)]
    Conformance(cmd::verify::ConformanceArgs),
}

#[derive(clap::Args, Debug)]
struct DbArgs {
    /// Database URL: sqlite://PATH or postgres://USER@HOST:PORT/DB.
    #[arg(long, env = "KERNELIZE_DB", default_value = DEFAULT_DB_URL)]
    db: String,
}

#[derive(clap::Args, Debug)]
struct ServeArgs {
    #[command(flatten)]
    db: DbArgs,
    /// Address to listen on (port 0 picks a free port; the chosen address is printed).
    #[arg(long, default_value = "127.0.0.1:8080")]
    bind: String,
    /// Folder of bundled kernels to load at start (one sub-folder per kernel).
    #[arg(long, default_value = "kernels")]
    kernels: PathBuf,
    /// Do not load bundled kernels.
    #[arg(long)]
    no_bundled: bool,
    /// Require a token for reads too (by default reads are public).
    #[arg(long)]
    private_reads: bool,
    /// How long a worker's claim on a job lasts without a heartbeat, in seconds.
    #[arg(long, default_value_t = 120)]
    lease_seconds: u64,
    /// The most verifications of unverified widths that /v1/resolve keeps queued or running at
    /// once (one per kernel and width; beyond the cap resolve answers without queueing).
    #[arg(long, default_value_t = 1000)]
    max_pending_width_jobs: u64,
    /// Also run an embedded GPU worker in this process (when the host has a GPU).
    #[arg(long)]
    worker: bool,
    /// With --worker: which GPU of this host to use.
    #[arg(long, requires = "worker")]
    gpu: Option<u32>,
    /// With --worker: model-level verification options (e.g. `--model models`).
    #[command(flatten)]
    model: cmd::verify::ModelArgs,
}

#[derive(Subcommand, Debug)]
enum TokenCommand {
    /// Create a token and print it once (only its hash is stored).
    Create {
        /// Scope: submit (kernel authors' CI), worker (GPU workers), admin (everything). Repeatable.
        #[arg(long = "scope", required = true)]
        scopes: Vec<String>,
        /// A name for the token, shown in the audit log.
        #[arg(long, default_value = "unnamed")]
        name: String,
        #[command(flatten)]
        db: DbArgs,
    },
}

fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,sqlx=warn,tower_http=info".into());
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        b.json().init();
    } else {
        b.init();
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The sandbox speaks JSON on stdout/stdin only; it logs nothing.
    if !matches!(cli.command, Command::Sandbox(_) | Command::Conformance(_)) {
        init_logging(cli.log_json);
    }
    let result = match cli.command {
        Command::Verify(a) => cmd::verify::verify(a),
        Command::Device(a) => cmd::verify::device(a),
        Command::Sandbox(a) => cmd::verify::sandbox(a),
        Command::Conformance(a) => cmd::verify::conformance(a),
        other => {
            // The verifier's sandbox processes inherit the GPU choice: set it before any
            // thread starts.
            match &other {
                Command::Worker(w) => cmd::worker::select_gpu(w.gpu),
                Command::Serve(s) if s.worker => cmd::worker::select_gpu(s.gpu),
                _ => {}
            }
            tokio::runtime::Runtime::new()
                .context("starting the async runtime")
                .and_then(|rt| rt.block_on(run_async(other)))
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run_async(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve(a) => serve(a).await,
        Command::Migrate(a) => {
            let store = Store::open(&a.db).await?;
            println!("database {} is up to date", a.db);
            store.close().await;
            Ok(ExitCode::SUCCESS)
        }
        Command::Token(TokenCommand::Create { scopes, name, db }) => {
            for s in &scopes {
                Scope::parse(s).map_err(anyhow::Error::msg)?;
            }
            let store = Store::open(&db.db).await?;
            let token = store.create_token(&name, &scopes).await?;
            println!("{token}");
            eprintln!(
                "token `{name}` with scopes [{}] created; it is shown only this once",
                scopes.join(", ")
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Submit(a) => cmd::submit::run(a).await,
        Command::Worker(a) => cmd::worker::run(a).await,
        Command::Verify(_) | Command::Device(_) | Command::Sandbox(_) | Command::Conformance(_) => {
            unreachable!("run synchronously")
        }
    }
}

async fn serve(a: ServeArgs) -> anyhow::Result<ExitCode> {
    let store = Store::open(&a.db.db)
        .await
        .with_context(|| format!("opening the database {}", a.db.db))?;
    if !a.no_bundled {
        if a.kernels.is_dir() {
            let loaded = kernelize::bundled::load(&store, &a.kernels).await?;
            tracing::info!(new = loaded.new, unchanged = loaded.unchanged, dir = %a.kernels.display(), "bundled kernels loaded");
        } else {
            tracing::warn!(dir = %a.kernels.display(), "no bundled kernels folder; pass --kernels DIR (or --no-bundled)");
        }
    }
    let state = AppState {
        store: store.clone(),
        config: Arc::new(Config {
            private_reads: a.private_reads,
            lease_ms: (a.lease_seconds.max(1) * 1000) as i64,
            max_pending_width_jobs: a.max_pending_width_jobs.min(i64::MAX as u64) as i64,
        }),
    };
    let listener = tokio::net::TcpListener::bind(&a.bind)
        .await
        .with_context(|| {
            format!(
                "binding {} (is another server using it? pass --bind ADDR)",
                a.bind
            )
        })?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, db = %a.db.db, "serving");
    // A plain line on stdout, for scripts and tests that start the server on port 0.
    println!("kernelize listening on http://{addr}");
    std::io::stdout().flush().ok();
    if a.worker {
        start_embedded_worker(&store, addr, a.gpu, a.model.clone()).await?;
    }
    axum::serve(listener, app(state))
        .with_graceful_shutdown(shutdown_signal())
        .await?;
    store.close().await;
    Ok(ExitCode::SUCCESS)
}

/// `serve --worker`: a worker in this process, talking to this server over HTTP like any other.
async fn start_embedded_worker(
    store: &Store,
    addr: std::net::SocketAddr,
    gpu: Option<u32>,
    model: cmd::verify::ModelArgs,
) -> anyhow::Result<()> {
    if !verifier::gpu_available() {
        tracing::warn!("--worker: no usable CUDA GPU on this host; jobs wait for an external `kernelize worker`");
        return Ok(());
    }
    let token = store
        .create_token("embedded-worker", &["worker".to_string()])
        .await?;
    let args = cmd::worker::WorkerArgs {
        server: format!("http://{addr}"),
        token,
        gpu,
        drain: false,
        quick: false,
        poll_seconds: 2,
        model,
    };
    tokio::spawn(async move {
        if let Err(e) = cmd::worker::run(args).await {
            tracing::error!("embedded worker stopped: {e:#}");
        }
    });
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        tokio::signal::ctrl_c().await.ok();
    };
    #[cfg(unix)]
    let term = async {
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            s.recv().await;
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
    tracing::info!("shutting down");
}
