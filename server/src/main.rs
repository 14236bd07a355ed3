//! `kernelize`: the kernel hub's one binary. Each subcommand is a process role.

use anyhow::Context;
use clap::Parser;
use kernel_store::{Store, TokenInfo};
use kernelize::app::{app, AppState, Config, Scope};
use kernelize::cli::{Cli, Command, ServeArgs, TokenCommand};
use kernelize::token_file::{self, Ensured};
use kernelize::{cmd, listener};
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

/// mimalloc instead of the system allocator: a resolve ranked for a policy never asked before
/// writes a few hundred short lines, and glibc's malloc spent about a quarter of the server's
/// time on them under load (`perf`, bench/LOAD.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    if cli.check_args {
        // Reached only when clap accepted the command line and the environment.
        println!("ok: `kernelize {}` parses", cli.command.name());
        return ExitCode::SUCCESS;
    }
    // The sandbox speaks JSON on stdout/stdin only; it logs nothing.
    if !matches!(cli.command, Command::Sandbox(_) | Command::Conformance(_)) {
        init_logging(cli.log_json);
    }
    let result = match cli.command {
        Command::Verify(a) => cmd::verify::verify(a),
        Command::Device(a) => cmd::verify::device(a),
        Command::Sandbox(a) => cmd::verify::sandbox(a),
        Command::Conformance(a) => cmd::verify::conformance(a),
        Command::Cert(c) => cmd::keys::cert_command(c),
        Command::Diff(a) => cmd::python::diff(a),
        Command::Lock(a) => cmd::python::lock(a),
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
                .and_then(|rt| {
                    let result = rt.block_on(run_async(other));
                    // Do not wait for background tasks without end: sqlx's pool maintenance
                    // task can spin at exit (sqlx #3645; seen here as a `token create` that
                    // printed its token, then ran at 100% CPU for 12 minutes).
                    rt.shutdown_timeout(std::time::Duration::from_secs(5));
                    result
                })
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
        Command::Token(
            t @ (TokenCommand::Create { .. }
            | TokenCommand::List { .. }
            | TokenCommand::Revoke { .. }),
        ) => token_command(t).await,
        Command::Token(TokenCommand::Ensure {
            scopes,
            name,
            file,
            db,
        }) => {
            for s in &scopes {
                Scope::parse(s).map_err(anyhow::Error::msg)?;
            }
            let store = Store::open(&db.db).await?;
            let (_, what) = token_file::ensure(&store, &file, &name, &scopes).await?;
            store.close().await;
            match what {
                Ensured::Reused => eprintln!(
                    "the token in {} is valid with scopes [{}]; kept",
                    file.display(),
                    scopes.join(", ")
                ),
                Ensured::Created => eprintln!(
                    "token `{name}` with scopes [{}] created and written to {} (mode 0600)",
                    scopes.join(", "),
                    file.display()
                ),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Submit(a) => cmd::submit::run(a).await,
        Command::Health(a) => cmd::health::run(a).await,
        Command::Worker(a) => cmd::worker::run(a).await,
        Command::WorkerKey(c) => cmd::keys::worker_key(c).await,
        Command::VerifyRequest(a) => cmd::reverify::run(a).await,
        Command::Verify(_)
        | Command::Device(_)
        | Command::Sandbox(_)
        | Command::Conformance(_)
        | Command::Diff(_)
        | Command::Lock(_)
        | Command::Cert(_) => {
            unreachable!("run synchronously")
        }
    }
}

/// `kernelize token create|list|revoke`, on the database (the operator's side of the API's
/// `/v1/tokens`). Audited with actor `admin`.
async fn token_command(t: TokenCommand) -> anyhow::Result<ExitCode> {
    match t {
        TokenCommand::Ensure { .. } => unreachable!("handled by run_async"),
        TokenCommand::Create {
            scopes,
            name,
            expires_in,
            db,
        } => {
            for s in &scopes {
                Scope::parse(s).map_err(anyhow::Error::msg)?;
            }
            let store = Store::open(&db.db).await?;
            let (info, token) = store
                .create_token(&name, &scopes, expires_in, "admin")
                .await?;
            println!("{token}");
            eprintln!(
                "token `{}` (id {}) with scopes [{}] created, {}; it is shown only this once",
                info.name,
                info.id,
                scopes.join(", "),
                match &info.expires_at {
                    Some(at) => format!("expires {at}"),
                    None => "never expires".into(),
                }
            );
            store.close().await;
        }
        TokenCommand::List { json, db } => {
            let store = Store::open(&db.db).await?;
            let tokens = store.list_tokens().await?;
            store.close().await;
            if json {
                println!("{}", serde_json::to_string_pretty(&tokens)?);
            } else {
                print_tokens(&tokens);
            }
        }
        TokenCommand::Revoke { token, db } => {
            let store = Store::open(&db.db).await?;
            let r = store.revoke_token(&token, "admin").await?;
            store.close().await;
            if r.already {
                println!(
                    "token `{}` (id {}) was already revoked at {}",
                    r.token.name,
                    r.token.id,
                    r.token.revoked_at.unwrap_or_default()
                );
            } else {
                println!(
                    "token `{}` (id {}) revoked; it stops working at once{}",
                    r.token.name,
                    r.token.id,
                    if r.requeued_jobs.is_empty() {
                        String::new()
                    } else {
                        format!(
                            "; jobs queued again: {}",
                            r.requeued_jobs
                                .iter()
                                .map(|j| j.to_string())
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    }
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The token table of `kernelize token list`.
fn print_tokens(tokens: &[TokenInfo]) {
    let now = kernel_store::now_ms();
    let rows: Vec<[String; 7]> = tokens
        .iter()
        .map(|t| {
            let state = if t.revoked_at.is_some() {
                "revoked"
            } else if t.is_expired(now) {
                "expired"
            } else {
                "active"
            };
            [
                t.id.to_string(),
                t.name.clone(),
                t.scopes.join(","),
                t.created_at.clone(),
                t.expires_at.clone().unwrap_or_else(|| "never".into()),
                t.last_used_at.clone().unwrap_or_else(|| "never".into()),
                match &t.revoked_at {
                    Some(at) => format!("{state} {at}"),
                    None => state.to_string(),
                },
            ]
        })
        .collect();
    let head = [
        "id",
        "name",
        "scopes",
        "created",
        "expires",
        "last used",
        "state",
    ];
    let mut width: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let parts: Vec<String> = cells
            .iter()
            .zip(&width)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", parts.join("  ").trim_end());
    };
    line(head.to_vec());
    for r in &rows {
        line(r.iter().map(String::as_str).collect());
    }
    if tokens.is_empty() {
        println!("(no tokens; create one with `kernelize token create --scope worker`)");
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
            let certs = if a.no_bundled_certificates {
                Default::default()
            } else {
                kernelize::bundled::import_certificates(&store, &a.kernels).await?
            };
            tracing::info!(
                new = certs.new,
                known = certs.known,
                stale = certs.stale,
                refused = certs.refused.len(),
                "bundled certificates (verifications recorded on the project's GPU runs) imported"
            );
            // Kernels the imported verifications cover need no suite job of this hub.
            let withdrawn = store.withdraw_covered_bundled_jobs("bundled").await?;
            if !withdrawn.is_empty() {
                tracing::info!(jobs = ?withdrawn, "suite jobs of bundled kernels covered by imported verifications withdrawn");
            }
        } else {
            tracing::warn!(dir = %a.kernels.display(), "no bundled kernels folder; pass --kernels DIR (or --no-bundled)");
        }
    }
    // The verdict index (resolve and the policy list read it) is read whole in the
    // background, a chunk of rows per query, while the server starts answering: the first
    // resolve waits for it instead of reading it itself.
    {
        let store = store.clone();
        tokio::spawn(async move {
            let t0 = std::time::Instant::now();
            let loaded = match store.answer_generation().await {
                Ok(g) => store.verdict_index(g).await.map(|_| ()),
                Err(e) => Err(e),
            };
            match loaded {
                Ok(()) => {
                    tracing::info!(ms = t0.elapsed().as_millis() as u64, "verdict index loaded")
                }
                Err(e) => {
                    tracing::warn!(error = %e, "verdict index not loaded (the first resolve loads it)")
                }
            }
        });
    }
    let state = AppState::new(
        store.clone(),
        Config {
            private_reads: a.private_reads,
            lease_ms: (a.lease_seconds.max(1) * 1000) as i64,
            max_pending_width_jobs: a.max_pending_width_jobs.min(i64::MAX as u64) as i64,
            min_suite_version: a.min_suite_version.clone(),
            require_signed_reports: !a.accept_unsigned_reports,
            body_timeout: Duration::from_secs(a.body_timeout_s),
            write_rate_per_minute: a.write_rate_per_minute,
            write_burst: a.write_burst,
            anonymous_rate_per_minute: a.anonymous_rate_per_minute,
            anonymous_burst: a.anonymous_burst,
        },
    );
    let limits = listener::Limits {
        max_connections: listener::fit_descriptors(a.max_connections as usize),
        header_timeout: Duration::from_secs(a.header_timeout_s),
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
    tracing::info!(%addr, db = %a.db.db, max_connections = limits.max_connections, "serving");
    // A plain line on stdout, for scripts and tests that start the server on port 0.
    println!("kernelize listening on http://{addr}");
    std::io::stdout().flush().ok();
    if a.worker {
        let token_file = a
            .worker_token_file
            .clone()
            .or_else(|| token_file::default_path(&a.db.db));
        start_embedded_worker(&store, addr, a.gpu, token_file.as_deref(), a.model.clone()).await?;
    }
    listener::serve(listener, app(state), limits, shutdown_signal()).await?;
    store.close().await;
    Ok(ExitCode::SUCCESS)
}

/// `serve --worker`: a worker in this process, talking to this server over HTTP like any other.
/// Its token is kept in `token_file` and reused at every start while the database accepts it
/// (one token per database, not one per start); it is ensured before the GPU is probed, so a
/// host whose GPU comes later finds it ready.
async fn start_embedded_worker(
    store: &Store,
    addr: std::net::SocketAddr,
    gpu: Option<u32>,
    token_file: Option<&Path>,
    model: cmd::verify::ModelArgs,
) -> anyhow::Result<()> {
    const NAME: &str = "embedded-worker";
    let scopes = ["worker".to_string()];
    let token = match token_file {
        Some(f) => {
            let (token, what) = token_file::ensure(store, f, NAME, &scopes)
                .await
                .with_context(|| format!("--worker: keeping the worker token in {} (pass --worker-token-file FILE elsewhere)", f.display()))?;
            tracing::info!(file = %f.display(), reused = (what == Ensured::Reused), "embedded worker token");
            token
        }
        // An in-memory database: its tokens end with the process, so nothing is kept.
        None => {
            store
                .create_token(
                    NAME,
                    &scopes,
                    kernel_store::DEFAULT_TOKEN_LIFETIME,
                    "system",
                )
                .await?
                .1
        }
    };
    // Its signing key, beside the token file and reused the same way: its reports are signed.
    let key_file = token_file.map(|f| {
        let mut name = f.file_name().unwrap_or_default().to_os_string();
        name.push(".key");
        f.with_file_name(name)
    });
    let key = cmd::keys::ensure_registered_key(store, key_file.as_deref())
        .await
        .context("--worker: keeping the embedded worker's signing key")?;
    if !verifier::gpu_available() {
        tracing::warn!("--worker: no usable CUDA GPU on this host; jobs wait for an external `kernelize worker`");
        return Ok(());
    }
    let args = cmd::worker::WorkerArgs {
        server: format!("http://{addr}"),
        token: Some(token),
        token_file: None,
        key_file: None,
        key: Some(key),
        gpu,
        drain: false,
        quick: false,
        poll_seconds: 2,
        model,
        // Python candidates: the defaults (python3, no extra packages, limits of `worker`).
        candidates: cmd::verify::PythonCandidateArgs {
            candidate_case_limit_s: 300,
            candidate_memory_gib: 32,
            ..Default::default()
        },
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
