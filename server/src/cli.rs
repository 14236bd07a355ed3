//! The `kernelize` command line: one clap definition for the binary and for the tests that check
//! command lines written elsewhere (docker/compose.yaml, the Dockerfiles) against it.

use crate::cmd;
pub use crate::cmd::db::DbArgs;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "kernelize",
    version,
    about = "A kernel hub that hands out only verified GPU layer replacements",
    long_about = "kernelize stores candidate CUDA kernels (RMSNorm, LayerNorm, SiLU, ...), verifies \
each on a real GPU against reference layers and an f64 oracle, and hands a client only kernels \
whose measured exactness meets its policy.\n\nStart the hub:   kernelize serve\nVerify a kernel: kernelize verify kernels/rms_norm_llama --policy bit_exact\nSubmit from CI:  kernelize submit DIR --server URL --token T --wait --policy bit_exact",
    after_help = "Storage: --db sqlite://PATH (default, created on first run) or postgres://USER@HOST:PORT/DB.\nEnvironment: KERNELIZE_DB, KERNELIZE_SERVER, KERNELIZE_TOKEN, KERNELIZE_TOKEN_FILE, KERNELIZE_LOG_JSON, RUST_LOG."
)]
pub struct Cli {
    /// Log as JSON lines instead of text (containers: KERNELIZE_LOG_JSON=true).
    #[arg(long, global = true, env = "KERNELIZE_LOG_JSON", value_parser = clap::builder::BoolishValueParser::new())]
    pub log_json: bool,
    /// Parse the command line and the environment, say which command would run, and exit
    /// without running it (for checking deployment files against this binary).
    #[arg(long, global = true, hide = true)]
    pub check_args: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
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
    /// Queue a kernel's verification on an architecture (a new GPU, driver or suite), or with
    /// --stale every kernel whose verdict there is stale (admin).
    VerifyRequest(cmd::reverify::VerifyRequestArgs),
    /// Workers' signing keys: create one, register its public key on a hub, list or revoke them.
    #[command(subcommand, name = "worker-key")]
    WorkerKey(cmd::keys::WorkerKeyCommand),
    /// Sign a report with a worker key, or check a verification's certificate offline.
    #[command(subcommand)]
    Cert(cmd::keys::CertCommand),
    /// Exit 0 when a hub answers /healthz (and, with --gpu, this host has a usable GPU): for
    /// container health checks, which need no curl in the image.
    Health(cmd::health::HealthArgs),
    // `diff` and `lock` run the Python client's programs; their help text (with examples) is
    // on their argument structs in cmd/python.rs.
    Diff(cmd::python::DiffArgs),
    Lock(cmd::python::LockArgs),
    #[command(name = "__sandbox", hide = true)]
    Sandbox(cmd::verify::SandboxArgs),
    /// Internal: compare the built-in reference layers with PyTorch eager outputs.
    #[command(name = "__conformance", hide = true)]
    Conformance(cmd::verify::ConformanceArgs),
}

impl Command {
    /// The subcommand's name as typed (`serve`, `token create`, ...), for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Serve(_) => "serve",
            Command::Migrate(_) => "migrate",
            Command::Token(TokenCommand::Create { .. }) => "token create",
            Command::Token(TokenCommand::Ensure { .. }) => "token ensure",
            Command::Token(TokenCommand::List { .. }) => "token list",
            Command::Token(TokenCommand::Revoke { .. }) => "token revoke",
            Command::Verify(_) => "verify",
            Command::Device(_) => "device",
            Command::Submit(_) => "submit",
            Command::Worker(_) => "worker",
            Command::WorkerKey(cmd::keys::WorkerKeyCommand::Init { .. }) => "worker-key init",
            Command::WorkerKey(cmd::keys::WorkerKeyCommand::Register { .. }) => {
                "worker-key register"
            }
            Command::WorkerKey(cmd::keys::WorkerKeyCommand::List { .. }) => "worker-key list",
            Command::WorkerKey(cmd::keys::WorkerKeyCommand::Revoke { .. }) => "worker-key revoke",
            Command::VerifyRequest(_) => "verify-request",
            Command::Cert(cmd::keys::CertCommand::Sign { .. }) => "cert sign",
            Command::Cert(cmd::keys::CertCommand::Verify { .. }) => "cert verify",
            Command::Health(_) => "health",
            Command::Diff(_) => "diff",
            Command::Lock(_) => "lock",
            Command::Sandbox(_) => "__sandbox",
            Command::Conformance(_) => "__conformance",
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// Address to listen on (port 0 picks a free port; the chosen address is printed).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub bind: String,
    /// Folder of bundled kernels to load at start (one sub-folder per kernel).
    #[arg(long, default_value = "kernels")]
    pub kernels: PathBuf,
    /// Do not load bundled kernels.
    #[arg(long)]
    pub no_bundled: bool,
    /// Load the bundled kernels without the verifications recorded on the project's GPU runs
    /// (`KERNELS/certificates/`): every verdict then comes from this hub's own workers.
    #[arg(long)]
    pub no_bundled_certificates: bool,
    /// Require a token for reads too (by default reads are public).
    #[arg(long)]
    pub private_reads: bool,
    /// How long a worker's claim on a job lasts without a heartbeat, in seconds.
    #[arg(long, default_value_t = 120)]
    pub lease_seconds: u64,
    /// Also store reports without a certificate (workers without a key, e.g. of an older
    /// release). By default a report is stored only with a certificate signed by a registered
    /// worker key (`kernelize worker-key init`, `worker-key register`, `worker --key-file`);
    /// a certificate that does not verify is refused either way.
    #[arg(long, env = "KERNELIZE_ACCEPT_UNSIGNED_REPORTS")]
    pub accept_unsigned_reports: bool,
    /// The most verifications of unverified widths that /v1/resolve keeps queued or running at
    /// once (one per kernel and width; beyond the cap resolve answers without queueing).
    #[arg(long, default_value_t = 1000)]
    pub max_pending_width_jobs: u64,
    /// The oldest verification suite whose reports are stored (default: the current one, whose
    /// case list the hub redraws and checks; older ones get the other checks only).
    #[arg(long, default_value = verifier::cases::SUITE_VERSION, value_parser = crate::state::Config::parse_min_suite)]
    pub min_suite_version: String,
    /// Close a connection whose request headers have not all arrived this many seconds after
    /// it started sending them (an idle keep-alive connection is closed after this long too).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub header_timeout_s: u64,
    /// Answer 408 and close the connection when a request's body has not all arrived this many
    /// seconds after its headers.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub body_timeout_s: u64,
    /// The most client connections open at once. When all are open, a new connection closes
    /// the one that has waited longest on its client (for its request's headers, idle between
    /// requests, sending a body without a valid token, or not reading its answer), so stalled
    /// clients cannot lock fresh ones out; when every one is busy, new ones wait in the listen
    /// backlog. The open-file limit is raised to fit (or this is lowered, with a warning).
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_connections: u64,
    /// Writes (POST) one token may make per minute; beyond it 429 with Retry-After. 0: no limit.
    #[arg(long, default_value_t = 1200)]
    pub write_rate_per_minute: u32,
    /// Writes one token may make at once before the per-minute rate applies.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    pub write_burst: u32,
    /// Requests without a valid token one client address (an IPv6 one by its /64) may make per
    /// minute; beyond it 429 with Retry-After. /healthz is never limited, nor a request with a
    /// valid token. Behind a reverse proxy every client shares the proxy's address. 0: no limit.
    #[arg(long, env = "KERNELIZE_ANONYMOUS_RATE_PER_MINUTE", default_value_t = crate::state::DEFAULT_ANONYMOUS_RATE_PER_MINUTE)]
    pub anonymous_rate_per_minute: u32,
    /// Requests without a token one address may make at once before the per-minute rate applies.
    #[arg(long, env = "KERNELIZE_ANONYMOUS_BURST", default_value_t = crate::state::DEFAULT_ANONYMOUS_BURST, value_parser = clap::value_parser!(u32).range(1..))]
    pub anonymous_burst: u32,
    /// Also run an embedded GPU worker in this process (when the host has a GPU).
    #[arg(long)]
    pub worker: bool,
    /// With --worker: which GPU of this host to use.
    #[arg(long, requires = "worker")]
    pub gpu: Option<u32>,
    /// With --worker: the file keeping the embedded worker's token (mode 0600), reused at every
    /// start while the database still accepts it. Default: beside a SQLite database file
    /// (`kernelize.db.worker-token`), else `kernelize.worker-token` in the current directory.
    #[arg(long, value_name = "FILE", requires = "worker")]
    pub worker_token_file: Option<PathBuf>,
    /// With --worker: model-level verification options (e.g. `--model models`).
    #[command(flatten)]
    pub model: cmd::verify::ModelArgs,
}

#[derive(Subcommand, Debug)]
pub enum TokenCommand {
    /// Create a token and print it once (only its hash is stored).
    Create {
        /// Scope: submit (kernel authors' CI), submit-python (Python candidates: they run code on the workers), worker (GPU workers), admin (everything). Repeatable.
        #[arg(long = "scope", required = true)]
        scopes: Vec<String>,
        /// A name for the token, shown in the audit log and `token list` (not a number).
        #[arg(long, default_value = "unnamed")]
        name: String,
        /// How long the token works: 90d, 12h, 30m, 45s, or `never`.
        #[arg(long, default_value = "90d")]
        expires_in: kernel_store::Expiry,
        #[command(flatten)]
        db: DbArgs,
    },
    /// List tokens: id, name, scopes, created, expires, last used, revoked (never a secret).
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Revoke a token by id or name: it stops working at once; jobs it holds are queued again.
    Revoke {
        /// The token's id (`token list`), or its name when one token not yet revoked has it.
        token: String,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Keep a token in FILE (mode 0600): reuse the one there while the database accepts it with
    /// these scopes, else create one and write it there. For unattended set-ups (a one-shot
    /// container that hands GPU workers their token through a shared volume).
    Ensure {
        /// Scope the token must hold (see `token create`). Repeatable.
        #[arg(long = "scope", required = true)]
        scopes: Vec<String>,
        /// A name for a created token, shown in the audit log.
        #[arg(long, default_value = "unnamed")]
        name: String,
        /// The token file (read by `kernelize worker --token-file FILE`).
        #[arg(long, value_name = "FILE")]
        file: PathBuf,
        #[command(flatten)]
        db: DbArgs,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `kernelize lock` and `kernelize diff` hand everything after `--` to the client's program.
    #[test]
    fn lock_and_diff_pass_their_arguments_on() {
        let args = [
            "--project",
            "app/pyproject.toml",
            "--hub",
            "http://hub:8080",
        ];
        let lock = Cli::try_parse_from(["kernelize", "lock", "--"].iter().chain(&args)).unwrap();
        assert_eq!(lock.command.name(), "lock");
        let Command::Lock(a) = lock.command else {
            panic!("not lock: {:?}", lock.command)
        };
        assert_eq!(a.py.args, args);
        let diff = Cli::try_parse_from([
            "kernelize",
            "diff",
            "--python",
            "py",
            "--",
            "--seed-model",
            "x",
        ])
        .unwrap();
        let Command::Diff(d) = diff.command else {
            panic!("not diff: {:?}", diff.command)
        };
        assert_eq!(
            (d.py.python.as_str(), d.py.args),
            ("py", vec!["--seed-model".to_string(), "x".into()])
        );
    }
}
