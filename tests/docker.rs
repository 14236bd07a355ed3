//! The Docker set-up (`docker/`) checked against this binary. No Docker engine runs in CI, so
//! the images are not built here; instead:
//!
//! - every `kernelize` command line that a container runs (compose `command`/`entrypoint`, an
//!   image's `ENTRYPOINT` + `CMD`, compose and Dockerfile health checks) is run through the
//!   built binary with `--check-args`, in that container's environment: the real clap parser
//!   accepts it or the failure quotes clap;
//! - every environment variable set for a kernelize container (compose `environment`,
//!   Dockerfile `ENV`) is one the binary reads: the clap definition's `env = ...` names
//!   (introspected), the `std::env::var` reads of the workspace's sources, and `RUST_LOG`;
//! - the images build the binary with `scripts/build-release`, which `scripts/gpu-stage` runs
//!   too; runtime stages run as a non-root user with a `HEALTHCHECK`; every `COPY` source exists
//!   and is let through the Dockerfile's `.dockerignore`;
//! - the compose wiring holds: `depends_on` targets and conditions, volumes, the workers' token
//!   file, ports, one GPU per worker, and every `${VARIABLE}` documented in `.env.example`.
//!
//! Each failure names the file and line and says how to fix it. The last test breaks copies of
//! the files on purpose and checks that the checks catch it.

mod support;

use clap::CommandFactory;
use serde::Deserialize;
use serde_saphyr::Spanned;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const COMPOSE: &str = "docker/compose.yaml";
const ENV_EXAMPLE: &str = "docker/.env.example";
const DOCKERFILES: [&str; 2] = ["docker/hub.Dockerfile", "docker/worker.Dockerfile"];
const BUILD_SCRIPT: &str = "scripts/build-release";
const GPU_STAGE: &str = "scripts/gpu-stage";

// ---- Dockerfiles -------------------------------------------------------------------------

/// One instruction, continuation lines joined; `line` is where it starts (1-based).
#[derive(Debug, Clone)]
struct Instr {
    line: usize,
    op: String,
    args: String,
}

#[derive(Debug, Clone)]
struct Stage {
    name: Option<String>,
    /// The image or earlier stage it starts from, ARGs substituted.
    base: String,
    line: usize,
    instrs: Vec<Instr>,
}

#[derive(Debug, Clone)]
struct Dockerfile {
    /// Relative to the top of the tree, e.g. `docker/hub.Dockerfile`.
    path: String,
    /// Global ARGs (before the first FROM) with their defaults.
    args: BTreeMap<String, String>,
    stages: Vec<Stage>,
}

/// Substitute `${NAME}` / `$NAME` from `vars` (Dockerfile ARG expansion).
fn expand_args(s: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = s.to_string();
    for (k, v) in vars {
        out = out
            .replace(&format!("${{{k}}}"), v)
            .replace(&format!("${k}"), v);
    }
    out
}

fn parse_dockerfile(path: &str, text: &str) -> Dockerfile {
    let mut instrs: Vec<Instr> = vec![];
    let mut pending: Option<(usize, String)> = None;
    for (i, raw) in text.lines().enumerate() {
        let trimmed = raw.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && pending.is_none()) {
            continue;
        }
        let (start, mut acc) = pending.take().unwrap_or((i + 1, String::new()));
        let (body, continues) = match trimmed.strip_suffix('\\') {
            Some(b) => (b.trim(), true),
            None => (trimmed, false),
        };
        if !acc.is_empty() && !body.is_empty() {
            acc.push(' ');
        }
        acc.push_str(body);
        if continues {
            pending = Some((start, acc));
        } else if !acc.is_empty() {
            let (op, args) = acc.split_once(char::is_whitespace).unwrap_or((&acc, ""));
            instrs.push(Instr {
                line: start,
                op: op.to_ascii_uppercase(),
                args: args.trim().to_string(),
            });
        }
    }
    let mut df = Dockerfile {
        path: path.to_string(),
        args: BTreeMap::new(),
        stages: vec![],
    };
    for ins in instrs {
        if ins.op == "FROM" {
            let words: Vec<&str> = ins
                .args
                .split_whitespace()
                .filter(|w| !w.starts_with("--"))
                .collect();
            let name = match words.as_slice() {
                [_, as_, name] if as_.eq_ignore_ascii_case("as") => Some(name.to_string()),
                _ => None,
            };
            df.stages.push(Stage {
                name,
                base: expand_args(words.first().copied().unwrap_or(""), &df.args),
                line: ins.line,
                instrs: vec![],
            });
        } else if let Some(stage) = df.stages.last_mut() {
            stage.instrs.push(ins);
        } else if ins.op == "ARG" {
            let (k, v) = ins.args.split_once('=').unwrap_or((&ins.args, ""));
            df.args.insert(k.trim().to_string(), v.trim().to_string());
        }
    }
    df
}

/// `["a", "b"]` (exec form) as words; `None` for the shell form.
fn exec_form(args: &str) -> Option<Vec<String>> {
    args.trim()
        .starts_with('[')
        .then(|| serde_json::from_str(args.trim()).ok())
        .flatten()
}

/// `ENV A=1 B="x y"` or `ENV A 1`.
fn env_pairs(args: &str) -> Vec<(String, String)> {
    let first = args.split_whitespace().next().unwrap_or("");
    if !first.contains('=') {
        let (k, v) = args.split_once(char::is_whitespace).unwrap_or((args, ""));
        return vec![(k.to_string(), v.trim().to_string())];
    }
    let mut out = vec![];
    let mut rest = args.trim();
    while !rest.is_empty() {
        let Some((k, after)) = rest.split_once('=') else {
            break;
        };
        let (v, next) = if let Some(q) = after.strip_prefix('"') {
            let end = q.find('"').unwrap_or(q.len());
            (q[..end].to_string(), q.get(end + 1..).unwrap_or(""))
        } else {
            let end = after.find(char::is_whitespace).unwrap_or(after.len());
            (after[..end].to_string(), &after[end..])
        };
        out.push((k.trim().to_string(), v));
        rest = next.trim();
    }
    out
}

/// What a stage's containers run with, earlier stages it builds on included.
#[derive(Debug, Clone, Default)]
struct Effective {
    user: Option<(String, usize)>,
    /// Words after `CMD` of a `HEALTHCHECK` (`None` also for `HEALTHCHECK NONE`); its line.
    healthcheck: Option<(Option<Vec<String>>, usize)>,
    entrypoint: Option<(Option<Vec<String>>, usize)>,
    cmd: Option<(Option<Vec<String>>, usize)>,
    env: BTreeMap<String, (String, usize)>,
    volumes: Vec<String>,
    /// (source, destination, line) of COPYs from the build context.
    copies: Vec<(Vec<String>, String, usize)>,
    runs: Vec<Instr>,
}

impl Dockerfile {
    fn stage(&self, name: &str) -> Option<&Stage> {
        self.stages.iter().find(|s| s.name.as_deref() == Some(name))
    }

    /// The chain of stages `name` builds on, oldest first.
    fn chain<'a>(&'a self, stage: &'a Stage) -> Vec<&'a Stage> {
        let mut chain = vec![];
        let mut cur = Some(stage);
        while let Some(s) = cur {
            chain.insert(0, s);
            cur = self
                .stage(&s.base)
                .filter(|b| b.line < s.line && !chain.iter().any(|c| c.line == b.line));
        }
        chain
    }

    fn effective(&self, stage: &Stage) -> Effective {
        let mut e = Effective::default();
        for s in self.chain(stage) {
            let mut cmd_set_here = false;
            for ins in &s.instrs {
                match ins.op.as_str() {
                    "USER" => e.user = Some((ins.args.clone(), ins.line)),
                    "ENV" => {
                        for (k, v) in env_pairs(&ins.args) {
                            e.env.insert(k, (v, ins.line));
                        }
                    }
                    "VOLUME" => match exec_form(&ins.args) {
                        Some(v) => e.volumes.extend(v),
                        None => e
                            .volumes
                            .extend(ins.args.split_whitespace().map(String::from)),
                    },
                    "ENTRYPOINT" => {
                        e.entrypoint = Some((exec_form(&ins.args), ins.line));
                        // Docker resets an inherited CMD when ENTRYPOINT is set.
                        if !cmd_set_here {
                            e.cmd = None;
                        }
                    }
                    "CMD" => {
                        e.cmd = Some((exec_form(&ins.args), ins.line));
                        cmd_set_here = true;
                    }
                    "HEALTHCHECK" => {
                        let words = ins
                            .args
                            .split_once("CMD")
                            .and_then(|(_, rest)| exec_form(rest));
                        e.healthcheck = Some((words, ins.line));
                    }
                    "COPY" | "ADD" => {
                        let words: Vec<&str> = ins.args.split_whitespace().collect();
                        if words.iter().any(|w| w.starts_with("--from=")) {
                            continue;
                        }
                        let plain: Vec<String> = words
                            .iter()
                            .filter(|w| !w.starts_with("--"))
                            .map(|w| w.to_string())
                            .collect();
                        if let Some((dest, srcs)) = plain.split_last() {
                            e.copies.push((srcs.to_vec(), dest.clone(), ins.line));
                        }
                    }
                    "RUN" => e.runs.push(ins.clone()),
                    _ => {}
                }
            }
        }
        e
    }

    /// Stages whose containers run `kernelize` (their ENTRYPOINT).
    fn runtime_stages(&self) -> Vec<&Stage> {
        self.stages
            .iter()
            .filter(|s| {
                matches!(self.effective(s).entrypoint, Some((Some(ref w), _)) if is_kernelize(w.first()))
            })
            .collect()
    }

    /// The stage a build with `target` (or none: the last stage) produces.
    fn target(&self, target: Option<&str>) -> Option<&Stage> {
        match target {
            Some(t) => self.stage(t),
            None => self.stages.last(),
        }
    }
}

fn is_kernelize(word: Option<&String>) -> bool {
    word.is_some_and(|w| w == "kernelize" || w.ends_with("/kernelize"))
}

// ---- compose -----------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
struct Compose {
    services: BTreeMap<String, Service>,
    #[serde(default)]
    volumes: BTreeMap<String, Option<serde_json::Value>>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Words {
    Exec(Vec<String>),
    Shell(String),
}

impl Words {
    fn words(&self) -> Vec<String> {
        match self {
            Words::Exec(w) => w.clone(),
            Words::Shell(s) => s.split_whitespace().map(String::from).collect(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Build {
    Context(String),
    Full {
        context: Option<String>,
        dockerfile: Option<String>,
        target: Option<String>,
    },
}

#[derive(Debug, Deserialize)]
struct Healthcheck {
    test: Option<Words>,
    #[serde(default)]
    disable: bool,
}

#[derive(Debug, Deserialize)]
struct Dependency {
    condition: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum DependsOn {
    List(Vec<String>),
    Map(BTreeMap<String, Dependency>),
}

#[derive(Debug, Deserialize)]
struct Device {
    driver: Option<String>,
    device_ids: Option<Vec<String>>,
    count: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
struct Reservations {
    devices: Option<Vec<Device>>,
}

#[derive(Debug, Deserialize)]
struct Resources {
    reservations: Option<Reservations>,
}

#[derive(Debug, Deserialize)]
struct Deploy {
    resources: Option<Resources>,
}

#[derive(Debug, Deserialize)]
struct Service {
    image: Option<Spanned<String>>,
    build: Option<Spanned<Build>>,
    command: Option<Spanned<Words>>,
    entrypoint: Option<Spanned<Words>>,
    environment: Option<Spanned<BTreeMap<String, serde_json::Value>>>,
    healthcheck: Option<Spanned<Healthcheck>>,
    depends_on: Option<Spanned<DependsOn>>,
    #[serde(default)]
    volumes: Vec<Spanned<String>>,
    #[serde(default)]
    ports: Vec<Spanned<String>>,
    deploy: Option<Spanned<Deploy>>,
    restart: Option<String>,
}

/// Compose's `${VAR}`, `${VAR:-default}`, `${VAR-default}`, `${VAR:?error}`, `${VAR?error}`,
/// `${VAR:+alt}`, `${VAR+alt}`, `$VAR` and `$$`, from `vars`.
fn interpolate(s: &str, vars: &BTreeMap<String, String>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(a) = after.strip_prefix('$') {
            out.push('$');
            rest = a;
        } else if let Some(body) = after.strip_prefix('{') {
            let end = body
                .find('}')
                .ok_or_else(|| format!("`{s}`: `${{` without a closing `}}`"))?;
            let expr = &body[..end];
            rest = &body[end + 1..];
            let name_end = expr
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(expr.len());
            let (name, op) = expr.split_at(name_end);
            let val = vars.get(name);
            let set_nonempty = val.is_some_and(|v| !v.is_empty());
            let pick = |ok: bool, word: &str| -> String {
                if ok {
                    val.cloned().unwrap_or_default()
                } else {
                    word.to_string()
                }
            };
            out.push_str(&if op.is_empty() {
                val.cloned().unwrap_or_default()
            } else if let Some(d) = op.strip_prefix(":-") {
                pick(set_nonempty, d)
            } else if let Some(d) = op.strip_prefix('-') {
                pick(val.is_some(), d)
            } else if let Some(m) = op.strip_prefix(":?") {
                if !set_nonempty {
                    return Err(format!("${{{name}}} is required: {m}"));
                }
                pick(true, "")
            } else if let Some(m) = op.strip_prefix('?') {
                if val.is_none() {
                    return Err(format!("${{{name}}} is required: {m}"));
                }
                pick(true, "")
            } else if let Some(a) = op.strip_prefix(":+") {
                if set_nonempty {
                    a.to_string()
                } else {
                    String::new()
                }
            } else if let Some(a) = op.strip_prefix('+') {
                if val.is_some() {
                    a.to_string()
                } else {
                    String::new()
                }
            } else {
                return Err(format!("`${{{expr}}}` is not compose interpolation syntax"));
            });
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            out.push_str(vars.get(&after[..end]).map(String::as_str).unwrap_or(""));
            rest = &after[end..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// Every variable `text` interpolates, with its line.
fn variables_used(text: &str) -> Vec<(String, usize)> {
    let mut out = vec![];
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with('#') {
            continue;
        }
        let mut rest = line;
        while let Some(p) = rest.find('$') {
            let after = &rest[p + 1..];
            if let Some(a) = after.strip_prefix('$') {
                rest = a;
                continue;
            }
            let body = after.strip_prefix('{').unwrap_or(after);
            let end = body
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(body.len());
            if end > 0 {
                out.push((body[..end].to_string(), i + 1));
            }
            rest = &body[end..];
        }
    }
    out
}

/// `KEY=VALUE` lines of an env file.
fn parse_env_file(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

// ---- what the binary reads ---------------------------------------------------------------

/// The environment variables the binary reads: every clap `env = ...` of its CLI (walked
/// through the real definition), every literal `env::var("...")`/`env::var_os("...")` in the
/// workspace's sources, and tracing's filter variable.
fn env_the_binary_reads() -> BTreeSet<String> {
    fn walk(cmd: &clap::Command, names: &mut BTreeSet<String>) {
        for a in cmd.get_arguments() {
            if let Some(e) = a.get_env() {
                names.insert(e.to_string_lossy().into_owned());
            }
        }
        for s in cmd.get_subcommands() {
            walk(s, names);
        }
    }
    let mut names = BTreeSet::new();
    walk(&kernelize::cli::Cli::command(), &mut names);
    let root = support::repo_root();
    for dir in ["server/src", "verifier/src", "kernel-registry/src"] {
        for file in rust_files(&root.join(dir)) {
            let text = std::fs::read_to_string(&file).unwrap();
            for pat in ["env::var(\"", "env::var_os(\""] {
                for (i, _) in text.match_indices(pat) {
                    let lit = &text[i + pat.len()..];
                    if let Some(end) = lit.find('"') {
                        names.insert(lit[..end].to_string());
                    }
                }
            }
        }
    }
    names.insert(tracing_subscriber::EnvFilter::DEFAULT_ENV.to_string());
    names
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(rust_files(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out
}

/// Run the binary with `argv[1..]` and `--check-args` in exactly `env`: `Err(clap's message)`
/// when its CLI refuses them.
fn binary_accepts(argv: &[String], env: &BTreeMap<String, String>) -> Result<(), String> {
    let out = std::process::Command::new(support::bin())
        .args(&argv[1..])
        .arg("--check-args")
        .env_clear()
        .envs(env)
        .output()
        .expect("running the kernelize binary");
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// The value of `--name V` or `--name=V` in `argv`.
fn flag<'a>(argv: &'a [String], name: &str) -> Option<&'a str> {
    let eq = format!("{name}=");
    argv.iter().enumerate().find_map(|(i, w)| {
        if w == name {
            argv.get(i + 1).map(String::as_str)
        } else {
            w.strip_prefix(&eq)
        }
    })
}

/// `host` and `port` of `http://host:port/...`.
fn host_port(url: &str) -> Option<(String, u16)> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split('/').next()?;
    let (host, port) = authority.rsplit_once(':')?;
    Some((host.to_string(), port.parse().ok()?))
}

/// Is `path` at or under `dir`?
fn under(path: &str, dir: &str) -> bool {
    let dir = dir.trim_end_matches('/');
    path == dir || path.starts_with(&format!("{dir}/"))
}

// ---- the set-up as a whole ---------------------------------------------------------------

struct Setup {
    root: PathBuf,
    compose_text: String,
    compose: Compose,
    vars: BTreeMap<String, String>,
    env_example_text: String,
    dockerfiles: BTreeMap<String, Dockerfile>,
    ignore_files: BTreeMap<String, String>,
    reads: BTreeSet<String>,
}

/// A kernelize container of the compose file, resolved.
struct Container<'a> {
    service: &'a str,
    dockerfile: &'a Dockerfile,
    stage: &'a Stage,
    argv: Vec<String>,
    /// Where `argv` comes from, for messages.
    argv_at: String,
    /// The image's ENV and the service's environment (interpolated).
    env: BTreeMap<String, String>,
}

fn read(root: &Path, rel: &str) -> String {
    std::fs::read_to_string(root.join(rel)).unwrap_or_else(|e| {
        panic!("{rel}: cannot read it ({e}); the Docker set-up lives in docker/")
    })
}

impl Setup {
    fn load() -> Setup {
        let root = support::repo_root();
        let dockerfiles = DOCKERFILES
            .iter()
            .map(|p| (p.to_string(), read(&root, p)))
            .collect();
        Setup::from_texts(root.clone(), read(&root, COMPOSE), dockerfiles)
    }

    fn from_texts(
        root: PathBuf,
        compose_text: String,
        dockerfiles: BTreeMap<String, String>,
    ) -> Setup {
        let compose: Compose = serde_saphyr::from_str(&compose_text)
            .unwrap_or_else(|e| panic!("{COMPOSE}: not the compose shape this check reads: {e}"));
        let env_example_text = read(&root, ENV_EXAMPLE);
        let ignore_files = dockerfiles
            .keys()
            .map(|p| {
                let ignore = format!("{p}.dockerignore");
                let text = std::fs::read_to_string(root.join(&ignore)).unwrap_or_default();
                (p.clone(), text)
            })
            .collect();
        Setup {
            vars: parse_env_file(&env_example_text),
            env_example_text,
            compose,
            compose_text,
            dockerfiles: dockerfiles
                .iter()
                .map(|(p, t)| (p.clone(), parse_dockerfile(p, t)))
                .collect(),
            ignore_files,
            reads: env_the_binary_reads(),
            root,
        }
    }

    fn at(&self, line: usize) -> String {
        format!("{COMPOSE}:{line}")
    }

    /// The line of `key:` at or after `from` (a map entry under a block starting there).
    fn key_line(&self, from: usize, key: &str) -> usize {
        self.compose_text
            .lines()
            .enumerate()
            .skip(from.saturating_sub(1))
            .find(|(_, l)| l.trim_start().starts_with(&format!("{key}:")))
            .map(|(i, _)| i + 1)
            .unwrap_or(from)
    }

    fn interp(&self, s: &str, line: usize, problems: &mut Vec<String>) -> String {
        interpolate(s, &self.vars).unwrap_or_else(|e| {
            problems.push(format!(
                "{}: {e} (with the values of {ENV_EXAMPLE}); define it there",
                self.at(line)
            ));
            s.to_string()
        })
    }

    /// The Dockerfile a service is built from (its own `build`, or that of the service that
    /// builds its `image`).
    fn built_from(&self, name: &str) -> Option<(&Dockerfile, Option<String>, usize)> {
        let svc = &self.compose.services[name];
        let build = svc.build.as_ref().or_else(|| {
            let image = &svc.image.as_ref()?.value;
            self.compose.services.values().find_map(|o| {
                (o.image.as_ref().map(|i| &i.value) == Some(image))
                    .then_some(o.build.as_ref())
                    .flatten()
            })
        })?;
        let (dockerfile, target) = match &build.value {
            Build::Context(_) => ("Dockerfile".to_string(), None),
            Build::Full {
                dockerfile, target, ..
            } => (
                dockerfile.clone().unwrap_or_else(|| "Dockerfile".into()),
                target.clone(),
            ),
        };
        let df = self.dockerfiles.get(&dockerfile)?;
        Some((df, target, build.defined.line() as usize))
    }

    /// Every kernelize container the compose file can start: one per service, or one per
    /// runtime stage when the build target is a variable.
    fn containers(&self, problems: &mut Vec<String>) -> Vec<Container<'_>> {
        let mut out = vec![];
        for (name, svc) in &self.compose.services {
            let Some((df, target, build_line)) = self.built_from(name) else {
                continue;
            };
            let stages: Vec<&Stage> = match &target {
                // A target chosen by a variable: every runtime stage may run.
                Some(t) if t.contains('$') => {
                    let chosen = self.interp(t, build_line, problems);
                    if df.stage(&chosen).is_none() {
                        problems.push(format!(
                            "{}: service `{name}`: build target `{t}` is `{chosen}` with {ENV_EXAMPLE}'s values, which is no stage of {}; set it to one of {:?}",
                            self.at(build_line),
                            df.path,
                            df.runtime_stages().iter().filter_map(|s| s.name.clone()).collect::<Vec<_>>()
                        ));
                    }
                    df.runtime_stages()
                }
                t => match df.target(t.as_deref()) {
                    Some(s) => vec![s],
                    None => {
                        problems.push(format!(
                            "{}: service `{name}`: build target `{}` is no stage of {}",
                            self.at(build_line),
                            t.clone().unwrap_or_default(),
                            df.path
                        ));
                        continue;
                    }
                },
            };
            for stage in stages {
                let eff = df.effective(stage);
                let mut env: BTreeMap<String, String> = eff
                    .env
                    .iter()
                    .map(|(k, (v, _))| (k.clone(), v.clone()))
                    .collect();
                if let Some(e) = &svc.environment {
                    for (k, v) in &e.value {
                        let line = self.key_line(e.defined.line() as usize, k);
                        let v = match v {
                            serde_json::Value::String(s) => self.interp(s, line, problems),
                            serde_json::Value::Null => continue,
                            other => other.to_string(),
                        };
                        env.insert(k.clone(), v);
                    }
                }
                let stage_name = stage.name.clone().unwrap_or_default();
                let (entry, entry_at) = match &svc.entrypoint {
                    Some(e) => (Some(e.value.words()), self.at(e.defined.line() as usize)),
                    None => (
                        eff.entrypoint.as_ref().and_then(|(w, _)| w.clone()),
                        format!(
                            "{}:{}",
                            df.path,
                            eff.entrypoint.as_ref().map_or(stage.line, |e| e.1)
                        ),
                    ),
                };
                // A compose entrypoint drops the image's CMD, as Docker does.
                let (cmd, cmd_at) = match (&svc.command, &svc.entrypoint) {
                    (Some(c), _) => (
                        c.value
                            .words()
                            .iter()
                            .map(|w| self.interp(w, c.defined.line() as usize, problems))
                            .collect(),
                        self.at(c.defined.line() as usize),
                    ),
                    (None, Some(_)) => (vec![], String::new()),
                    (None, None) => (
                        eff.cmd
                            .as_ref()
                            .and_then(|(w, _)| w.clone())
                            .unwrap_or_default(),
                        format!(
                            "{}:{} (stage `{stage_name}`'s CMD)",
                            df.path,
                            eff.cmd.as_ref().map_or(stage.line, |c| c.1)
                        ),
                    ),
                };
                let Some(entry) = entry else {
                    problems.push(format!(
                        "{entry_at}: service `{name}` has no exec-form entrypoint; give the image `ENTRYPOINT [\"kernelize\"]`"
                    ));
                    continue;
                };
                let mut argv = entry;
                argv.extend(cmd);
                if !is_kernelize(argv.first()) {
                    continue;
                }
                out.push(Container {
                    service: name,
                    dockerfile: df,
                    stage,
                    argv,
                    argv_at: if cmd_at.is_empty() { entry_at } else { cmd_at },
                    env,
                });
            }
        }
        out
    }
}

fn report(what: &str, mut problems: Vec<String>) {
    // One service checked per build target can find the same thing several times.
    let mut seen = BTreeSet::new();
    problems.retain(|p| seen.insert(p.clone()));
    assert!(
        problems.is_empty(),
        "{what}: {} problem(s):\n- {}",
        problems.len(),
        problems.join("\n- ")
    );
}

// ---- the checks --------------------------------------------------------------------------

/// The images build the binary with scripts/build-release, which scripts/gpu-stage runs too.
fn check_build_command(s: &Setup) -> Vec<String> {
    let mut p = vec![];
    let script = read(&s.root, BUILD_SCRIPT);
    if !script
        .lines()
        .any(|l| l.contains("cargo build --release") && l.contains("-p kernelize"))
    {
        p.push(format!(
            "{BUILD_SCRIPT}: no `cargo build --release ... -p kernelize` line; it is the one release build the images and scripts/gpu-stage share"
        ));
    }
    let gpu_stage = read(&s.root, GPU_STAGE);
    for (i, l) in gpu_stage.lines().enumerate() {
        let code = l.split('#').next().unwrap_or("");
        if code.contains("cargo build") {
            p.push(format!(
                "{GPU_STAGE}:{}: builds with its own `cargo build`; call {BUILD_SCRIPT} instead so it builds what the images build",
                i + 1
            ));
        }
    }
    if !gpu_stage.lines().any(|l| {
        !l.trim_start().starts_with('#') && l.contains(BUILD_SCRIPT) && !l.contains("echo")
    }) {
        p.push(format!(
            "{GPU_STAGE}: does not run {BUILD_SCRIPT}; build the release binary with it"
        ));
    }
    let mut build_stages = vec![];
    for df in s.dockerfiles.values() {
        let builders: Vec<&Stage> = df
            .stages
            .iter()
            .filter(|st| {
                st.instrs
                    .iter()
                    .any(|i| i.op == "RUN" && i.args.contains(BUILD_SCRIPT))
            })
            .collect();
        for st in &df.stages {
            for i in &st.instrs {
                if i.op == "RUN" && i.args.contains("cargo build") {
                    p.push(format!(
                        "{}:{}: RUN calls `cargo build` itself; run {BUILD_SCRIPT} (the build scripts/gpu-stage runs)",
                        df.path, i.line
                    ));
                }
            }
        }
        match builders.as_slice() {
            [b] => {
                let name = b.name.clone().unwrap_or_default();
                if !df.stages.iter().any(|st| st.line > b.line) {
                    p.push(format!("{}:{}: the build stage is the last one; the runtime stages must follow it", df.path, b.line));
                }
                for st in df.runtime_stages() {
                    let chain = df.chain(st);
                    let copies_binary = chain.iter().any(|c| {
                        c.instrs.iter().any(|i| {
                            i.op == "COPY"
                                && i.args.contains(&format!("--from={name}"))
                                && i.args.contains("kernelize")
                        })
                    });
                    if !copies_binary {
                        p.push(format!(
                            "{}:{}: stage `{}` does not COPY --from={name} the kernelize binary built there",
                            df.path,
                            st.line,
                            st.name.clone().unwrap_or_default()
                        ));
                    }
                }
                build_stages.push((df.path.clone(), (*b).clone()));
            }
            [] => p.push(format!(
                "{}: no stage RUNs {BUILD_SCRIPT}; build the binary with it (as scripts/gpu-stage does)",
                df.path
            )),
            _ => p.push(format!("{}: several stages RUN {BUILD_SCRIPT}; keep one build stage", df.path)),
        }
    }
    // The two images must carry the same binary: their build stages are the same.
    if let [(pa, a), rest @ ..] = build_stages.as_slice() {
        for (pb, b) in rest {
            let sig = |st: &Stage| {
                st.instrs
                    .iter()
                    .map(|i| (i.op.clone(), i.args.clone()))
                    .collect::<Vec<_>>()
            };
            if (&a.base, sig(a)) != (&b.base, sig(b)) {
                p.push(format!(
                    "{pb}:{}: its build stage differs from {pa}:{}'s; keep them identical so both images carry the same binary",
                    b.line, a.line
                ));
            }
        }
    }
    p
}

/// Runtime stages: non-root, a kernelize HEALTHCHECK that parses, exec-form ENTRYPOINT/CMD,
/// an ENV the binary reads, and the hub's kernels and data where its command looks for them.
fn check_runtime_stages(s: &Setup) -> Vec<String> {
    let mut p = vec![];
    for df in s.dockerfiles.values() {
        let runtime = df.runtime_stages();
        if runtime.is_empty() {
            p.push(format!(
                "{}: no stage runs kernelize (ENTRYPOINT [\"kernelize\"])",
                df.path
            ));
        }
        for st in runtime {
            let name = st.name.clone().unwrap_or_default();
            let eff = df.effective(st);
            let env: BTreeMap<String, String> = eff
                .env
                .iter()
                .map(|(k, (v, _))| (k.clone(), v.clone()))
                .collect();
            match &eff.user {
                None => p.push(format!(
                    "{}:{}: stage `{name}` runs as root; add `USER <unprivileged user>` (create it with useradd)",
                    df.path, st.line
                )),
                Some((u, line)) => {
                    let who = u.split(':').next().unwrap_or("");
                    if who == "root" || who == "0" || who.starts_with('$') {
                        p.push(format!(
                            "{}:{line}: stage `{name}` runs as `{u}`; run as an unprivileged user (USER kernelize)",
                            df.path
                        ));
                    }
                }
            }
            match &eff.healthcheck {
                None => p.push(format!(
                    "{}:{}: stage `{name}` has no HEALTHCHECK; add `HEALTHCHECK CMD [\"kernelize\", \"health\", ...]`",
                    df.path, st.line
                )),
                Some((None, line)) => p.push(format!(
                    "{}:{line}: stage `{name}`'s HEALTHCHECK is not `CMD [\"kernelize\", \"health\", ...]` in exec form",
                    df.path
                )),
                Some((Some(words), line)) => {
                    if !is_kernelize(words.first()) || words.get(1).map(String::as_str) != Some("health") {
                        p.push(format!(
                            "{}:{line}: stage `{name}`'s HEALTHCHECK runs {words:?}; use `kernelize health` (the image has no curl)",
                            df.path
                        ));
                    } else if let Err(e) = binary_accepts(words, &env) {
                        p.push(format!("{}:{line}: stage `{name}`'s HEALTHCHECK {words:?} does not parse: {e}", df.path));
                    }
                }
            }
            if let Some((None, line)) = &eff.cmd {
                p.push(format!(
                    "{}:{line}: stage `{name}`'s CMD is in shell form; write it as a JSON array",
                    df.path
                ));
            }
            for (k, (_, line)) in &eff.env {
                if !s.reads.contains(k) {
                    p.push(format!(
                        "{}:{line}: stage `{name}` sets {k}, which the kernelize binary never reads; remove it or fix its name",
                        df.path
                    ));
                }
            }
            // Folders the command reads (kernels, models) must have been copied there.
            let cmd_words = eff
                .cmd
                .as_ref()
                .and_then(|(w, _)| w.clone())
                .unwrap_or_default();
            for (flag_name, source) in [("--kernels", "kernels"), ("--model", "models")] {
                if let Some(dir) = flag(&cmd_words, flag_name) {
                    let line = eff.cmd.as_ref().map_or(st.line, |c| c.1);
                    if !eff.copies.iter().any(|(src, dest, _)| {
                        src.iter().any(|x| x == source) && dest.trim_end_matches('/') == dir
                    }) {
                        p.push(format!(
                            "{}:{line}: stage `{name}` runs with `{flag_name} {dir}` but copies no `{source}` there; add `COPY {source} {dir}`",
                            df.path
                        ));
                    }
                }
            }
            let cmd = &cmd_words;
            if cmd.first().map(String::as_str) == Some("serve") {
                let line = eff.cmd.as_ref().map_or(st.line, |c| c.1);
                if flag(cmd, "--kernels").is_none() {
                    p.push(format!(
                        "{}:{line}: `serve` without --kernels looks in `kernels` under the working directory; pass --kernels with the folder the bundled kernels are copied to",
                        df.path
                    ));
                }
                // The hub image runs alone too (`docker run`, SQLite in its volume).
                let mut argv = eff
                    .entrypoint
                    .as_ref()
                    .and_then(|(w, _)| w.clone())
                    .unwrap_or_default();
                argv.extend(cmd.iter().cloned());
                if let Err(e) = binary_accepts(&argv, &env) {
                    p.push(format!(
                        "{}:{line}: stage `{name}` run alone ({argv:?}) does not parse: {e}",
                        df.path
                    ));
                }
                if let Some((db, line)) = eff.env.get("KERNELIZE_DB") {
                    if let Some(path) = db.strip_prefix("sqlite://") {
                        if !eff.volumes.iter().any(|v| under(path, v)) {
                            p.push(format!(
                                "{}:{line}: the SQLite database {path} is not in a VOLUME; declare its folder one so the data outlives the container",
                                df.path
                            ));
                        }
                    }
                }
            }
        }
    }
    p
}

/// The worker image's CUDA matches the verifier's cudarc build, and the headers the bundled
/// kernels include are checked to exist in it at build time.
fn check_cuda(s: &Setup) -> Vec<String> {
    let mut p = vec![];
    let cargo = read(&s.root, "Cargo.toml");
    let Some(feature) = cargo
        .split('"')
        .find(|w| w.starts_with("cuda-") && w[5..].chars().all(|c| c.is_ascii_digit()))
    else {
        return vec!["Cargo.toml: no cudarc `cuda-NNNNN` feature found; this check reads the CUDA version from it".into()];
    };
    let digits = &feature[5..];
    let (major, minor) = (&digits[..2], digits[2..4].trim_start_matches('0'));
    let minor = if minor.is_empty() { "0" } else { minor };
    let Some(df) = s
        .dockerfiles
        .values()
        .find(|d| d.args.contains_key("CUDA_IMAGE"))
    else {
        return vec![
            "docker/worker.Dockerfile: no `ARG CUDA_IMAGE=nvidia/cuda:...` before the first FROM"
                .into(),
        ];
    };
    let image = &df.args["CUDA_IMAGE"];
    if !image.contains(&format!(":{major}.{minor}.")) {
        p.push(format!(
            "{}: ARG CUDA_IMAGE={image} is not CUDA {major}.{minor}, which the verifier is built for (cudarc feature {feature} in Cargo.toml)",
            df.path
        ));
    }
    let includes: BTreeSet<String> = std::fs::read_dir(s.root.join("kernels"))
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("kernel.cu")).ok())
        .flat_map(|src| {
            src.lines()
                .filter_map(|l| {
                    l.trim()
                        .strip_prefix("#include <")
                        .and_then(|r| r.split_once('>'))
                        .map(|(h, _)| h.to_string())
                })
                .collect::<Vec<_>>()
        })
        .collect();
    for st in df.runtime_stages() {
        let eff = df.effective(st);
        let Some((cuda_home, _)) = eff.env.get("CUDA_HOME") else {
            p.push(format!(
                "{}:{}: stage `{}` does not set CUDA_HOME; the verifier passes $CUDA_HOME/include to NVRTC",
                df.path,
                st.line,
                st.name.clone().unwrap_or_default()
            ));
            continue;
        };
        let runs: String = eff
            .runs
            .iter()
            .map(|r| r.args.clone())
            .collect::<Vec<_>>()
            .join("\n");
        for h in &includes {
            if !runs.contains(&format!("test -f {cuda_home}/include/{h}")) {
                p.push(format!(
                    "{}:{}: the bundled kernels include <{h}>, but no RUN checks `test -f {cuda_home}/include/{h}`; install the package that has it and add the check",
                    df.path,
                    st.line
                ));
            }
        }
    }
    p
}

/// Every COPY source exists and is let through the Dockerfile's `.dockerignore`.
fn check_copies(s: &Setup) -> Vec<String> {
    let mut p = vec![];
    for df in s.dockerfiles.values() {
        let ignore_name = format!("{}.dockerignore", df.path);
        let ignore = &s.ignore_files[&df.path];
        let patterns: Vec<&str> = ignore
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect();
        if patterns.first() != Some(&"*") {
            p.push(format!(
                "{ignore_name}: must start with `*` and let through only what the Dockerfile copies (`!path`), so target/ and python/.venv stay out of the build context"
            ));
        }
        let allowed: Vec<&str> = patterns
            .iter()
            .filter_map(|l| l.strip_prefix('!'))
            .collect();
        for st in &df.stages {
            for i in &st.instrs {
                if !(i.op == "COPY" || i.op == "ADD") || i.args.contains("--from=") {
                    continue;
                }
                let words: Vec<&str> = i
                    .args
                    .split_whitespace()
                    .filter(|w| !w.starts_with("--"))
                    .collect();
                let Some((_, srcs)) = words.split_last() else {
                    continue;
                };
                for src in srcs {
                    let src = src.trim_start_matches("./").trim_end_matches('/');
                    if !s.root.join(src).exists() {
                        p.push(format!(
                            "{}:{}: COPY {src}: no such file or folder at the top of the tree",
                            df.path, i.line
                        ));
                    }
                    if !allowed.iter().any(|a| under(src, a)) {
                        p.push(format!("{}:{}: COPY {src}: {ignore_name} keeps it out of the build context; add `!{src}` there", df.path, i.line));
                    }
                }
            }
        }
    }
    p
}

/// Every kernelize command line and health check of the compose file parses with the binary,
/// in its container's environment.
fn check_compose_commands(s: &Setup) -> Vec<String> {
    let mut p = vec![];
    let containers = s.containers(&mut p);
    if containers.is_empty() {
        p.push(format!(
            "{COMPOSE}: no service runs kernelize; build one from {DOCKERFILES:?}"
        ));
    }
    for c in &containers {
        let stage = c.stage.name.clone().unwrap_or_default();
        eprintln!(
            "checking service `{}` (stage `{stage}` of {}): {:?} with {:?}",
            c.service,
            c.dockerfile.path,
            c.argv,
            c.env.keys().collect::<Vec<_>>()
        );
        if let Err(e) = binary_accepts(&c.argv, &c.env) {
            p.push(format!(
                "{}: service `{}` (image stage `{stage}` of {}) runs {:?}, which the binary refuses: {e}",
                c.argv_at, c.service, c.dockerfile.path, c.argv
            ));
        }
        let svc = &s.compose.services[c.service];
        if let Some(h) = &svc.healthcheck {
            let line = h.defined.line() as usize;
            if let Some(test) = &h.value.test {
                let words = test.words();
                let (first, rest) = words
                    .split_first()
                    .map(|(f, r)| (f.as_str(), r.to_vec()))
                    .unwrap_or(("", vec![]));
                if (first == "CMD") && is_kernelize(rest.first()) {
                    if let Err(e) = binary_accepts(&rest, &c.env) {
                        p.push(format!(
                            "{}: service `{}`'s healthcheck {rest:?} does not parse: {e}",
                            s.at(line),
                            c.service
                        ));
                    }
                } else if !h.value.disable {
                    p.push(format!(
                        "{}: service `{}`'s healthcheck {words:?} is not [\"CMD\", \"kernelize\", \"health\", ...]; the image has no shell tools to probe with",
                        s.at(line),
                        c.service
                    ));
                }
            }
        }
    }
    p
}

/// Every environment variable set for a kernelize service is one the binary reads.
fn check_compose_environment(s: &Setup) -> Vec<String> {
    let mut p = vec![];
    for (name, svc) in &s.compose.services {
        if s.built_from(name).is_none() {
            continue;
        }
        let Some(env) = &svc.environment else {
            continue;
        };
        for k in env.value.keys() {
            if !s.reads.contains(k) {
                let line = s.key_line(env.defined.line() as usize, k);
                p.push(format!(
                    "{}: service `{name}` sets {k}, which the kernelize binary never reads (it reads: {}); remove it or fix its name",
                    s.at(line),
                    s.reads.iter().filter(|r| r.starts_with("KERNELIZE_") || *r == "RUST_LOG").cloned().collect::<Vec<_>>().join(", ")
                ));
            }
        }
    }
    p
}

/// depends_on, volumes, the token file, ports and GPUs fit together.
fn check_compose_wiring(s: &Setup) -> Vec<String> {
    let mut p = vec![];
    let services = &s.compose.services;
    let containers = s.containers(&mut vec![]);
    let has_healthcheck = |name: &str| -> bool {
        let svc = &services[name];
        match &svc.healthcheck {
            Some(h) if h.value.disable => false,
            Some(h) if h.value.test.is_some() => true,
            _ => containers.iter().filter(|c| c.service == name).any(|c| {
                matches!(
                    c.dockerfile.effective(c.stage).healthcheck,
                    Some((Some(_), _))
                )
            }),
        }
    };
    // Named volumes: (service, volume, mount point, read-only, line).
    let mut mounts: Vec<(&str, String, String, usize)> = vec![];
    for (name, svc) in services {
        // The Dockerfiles COPY paths of the top of the tree: that is the build context.
        if let Some(b) = &svc.build {
            let context = match &b.value {
                Build::Context(c) => Some(c.as_str()),
                Build::Full { context, .. } => context.as_deref(),
            };
            let top = Path::new(COMPOSE)
                .parent()
                .unwrap()
                .join(context.unwrap_or("."));
            let resolved = std::fs::canonicalize(s.root.join(&top)).ok();
            if resolved != std::fs::canonicalize(&s.root).ok() {
                p.push(format!(
                    "{}: service `{name}` builds with context {context:?}, not the top of the tree; set `context: ..` (the Dockerfiles COPY paths from there)",
                    s.at(b.defined.line() as usize)
                ));
            }
        }
        for v in &svc.volumes {
            let parts: Vec<&str> = v.value.split(':').collect();
            let line = v.defined.line() as usize;
            if parts.len() < 2 {
                p.push(format!(
                    "{}: service `{name}`: volume `{}` has no mount point; write NAME:/PATH",
                    s.at(line),
                    v.value
                ));
                continue;
            }
            let (vol, path) = (parts[0], parts[1]);
            if !vol.starts_with('.') && !vol.starts_with('/') {
                if !s.compose.volumes.contains_key(vol) {
                    p.push(format!("{}: service `{name}` mounts volume `{vol}`, which the top-level `volumes:` does not declare; declare it there", s.at(line)));
                }
                mounts.push((name, vol.to_string(), path.to_string(), line));
            }
        }
        if let Some(d) = &svc.depends_on {
            let line = d.defined.line() as usize;
            let deps: Vec<(String, Option<String>)> = match &d.value {
                DependsOn::List(l) => l.iter().map(|n| (n.clone(), None)).collect(),
                DependsOn::Map(m) => m
                    .iter()
                    .map(|(n, dep)| (n.clone(), dep.condition.clone()))
                    .collect(),
            };
            for (dep, cond) in deps {
                let dl = s.key_line(line, &dep);
                if !services.contains_key(&dep) {
                    p.push(format!(
                        "{}: service `{name}` depends on `{dep}`, which is no service here",
                        s.at(dl)
                    ));
                    continue;
                }
                match cond.as_deref() {
                    Some("service_healthy") if !has_healthcheck(&dep) => p.push(format!(
                        "{}: service `{name}` waits for `{dep}` to be healthy, but `{dep}` has no health check; give it one or wait for service_started",
                        s.at(dl)
                    )),
                    Some("service_completed_successfully")
                        if services[&dep].restart.as_deref().is_some_and(|r| r != "no") =>
                    {
                        p.push(format!(
                            "{}: service `{name}` waits for `{dep}` to complete, but `{dep}` restarts ({}); make it `restart: \"no\"`",
                            s.at(dl),
                            services[&dep].restart.clone().unwrap_or_default()
                        ))
                    }
                    _ => {}
                }
            }
        }
    }
    for v in s.compose.volumes.keys() {
        if !mounts.iter().any(|(_, vol, _, _)| vol == v) {
            p.push(format!("{COMPOSE}: volume `{v}` is declared but no service mounts it; remove it or mount it"));
        }
    }
    let mount_of = |svc: &str, path: &str| -> Option<(String, String)> {
        mounts
            .iter()
            .filter(|(s2, _, mp, _)| *s2 == svc && under(path, mp))
            .max_by_key(|(_, _, mp, _)| mp.len())
            .map(|(_, v, mp, _)| (v.clone(), mp.clone()))
    };
    // Paths the binary writes or reads across restarts must be on a volume.
    let env_line = |svc: &str, key: &str| -> String {
        let e = services[svc]
            .environment
            .as_ref()
            .map_or(1, |e| s.key_line(e.defined.line() as usize, key));
        s.at(e)
    };
    // The hub's bind port, per service running `serve`.
    let serve_ports: BTreeMap<&str, u16> = containers
        .iter()
        .filter(|c| c.argv.get(1).map(String::as_str) == Some("serve"))
        .filter_map(|c| {
            let bind = flag(&c.argv, "--bind").unwrap_or("127.0.0.1:8080");
            Some((c.service, bind.rsplit_once(':')?.1.parse().ok()?))
        })
        .collect();
    let mut gpu_ids: BTreeMap<String, &str> = BTreeMap::new();
    for c in &containers {
        let sub = c.argv.get(1).map(String::as_str).unwrap_or("");
        for key in ["KERNELIZE_TOKEN_FILE", "KERNELIZE_COMPILE_CACHE"] {
            if let Some(path) = c.env.get(key) {
                let has_volume = mount_of(c.service, path).is_some()
                    || c.dockerfile
                        .effective(c.stage)
                        .volumes
                        .iter()
                        .any(|v| under(path, v));
                if !has_volume {
                    p.push(format!(
                        "{}: service `{}`: {key}={path} is on no volume; mount one at its folder",
                        env_line(c.service, key),
                        c.service
                    ));
                }
            }
        }
        // The token file comes from a `token ensure --file` service through a shared volume.
        if let Some(file) = c.env.get("KERNELIZE_TOKEN_FILE") {
            let writer = containers.iter().find(|w| {
                w.argv.get(1..3).is_some_and(|a| a == ["token", "ensure"])
                    && flag(&w.argv, "--file") == Some(file.as_str())
            });
            match writer {
                None => p.push(format!(
                    "{}: service `{}` reads its token from {file}, but no service runs `kernelize token ensure --file {file}`",
                    env_line(c.service, "KERNELIZE_TOKEN_FILE"),
                    c.service
                )),
                Some(w) => {
                    let (mine, theirs) = (mount_of(c.service, file), mount_of(w.service, file));
                    if mine.is_none() || mine != theirs {
                        p.push(format!(
                            "{}: service `{}` reads {file} from volume {mine:?}, but `{}` writes it to {theirs:?}; mount the same volume at the same folder in both",
                            env_line(c.service, "KERNELIZE_TOKEN_FILE"),
                            c.service,
                            w.service
                        ));
                    }
                    let waits = match services[c.service].depends_on.as_ref().map(|d| &d.value) {
                        Some(DependsOn::Map(m)) => m.get(w.service).and_then(|d| d.condition.as_deref()) == Some("service_completed_successfully"),
                        _ => false,
                    };
                    if !waits {
                        p.push(format!(
                            "{}: service `{}` must wait for `{}` (depends_on condition service_completed_successfully) before it reads the token file",
                            s.at(services[c.service].depends_on.as_ref().map_or(1, |d| d.defined.line() as usize)),
                            c.service,
                            w.service
                        ));
                    }
                }
            }
        }
        // KERNELIZE_SERVER names a service running `serve`, on its port.
        if let Some(url) = c.env.get("KERNELIZE_SERVER") {
            match host_port(url) {
                Some((host, port)) if serve_ports.get(host.as_str()) == Some(&port) => {}
                _ => p.push(format!(
                    "{}: service `{}`: KERNELIZE_SERVER={url} is not a hub of this file; use http://SERVICE:PORT of one of {serve_ports:?}",
                    env_line(c.service, "KERNELIZE_SERVER"),
                    c.service
                )),
            }
        }
        if sub == "serve" {
            let port = serve_ports.get(c.service).copied().unwrap_or(0);
            let svc = &services[c.service];
            if let Some(h) = &svc.healthcheck {
                let words = h.value.test.as_ref().map(Words::words).unwrap_or_default();
                if let Some(url) = flag(&words, "--server") {
                    if host_port(url).map(|(_, p)| p) != Some(port) {
                        p.push(format!(
                            "{}: service `{}`'s healthcheck probes {url}, but it serves on port {port} (--bind); probe that port",
                            s.at(h.defined.line() as usize),
                            c.service
                        ));
                    }
                }
            }
            for ports in &svc.ports {
                let spec = s.interp(&ports.value, ports.defined.line() as usize, &mut p);
                let inner = spec
                    .rsplit(':')
                    .next()
                    .and_then(|x| x.split('/').next()?.parse::<u16>().ok());
                if inner != Some(port) {
                    p.push(format!(
                        "{}: service `{}` publishes container port {inner:?}, but it serves on {port} (--bind); publish HOST:{port}",
                        s.at(ports.defined.line() as usize),
                        c.service
                    ));
                }
            }
        }
        // One GPU per worker, each GPU once; the container sees it as device 0.
        if sub == "worker" {
            let svc = &services[c.service];
            let line = svc
                .deploy
                .as_ref()
                .map_or_else(|| s.key_line(1, c.service), |d| d.defined.line() as usize);
            let ids: Vec<String> = svc
                .deploy
                .as_ref()
                .and_then(|d| d.value.resources.as_ref())
                .and_then(|r| r.reservations.as_ref())
                .and_then(|r| r.devices.as_ref())
                .map(|ds| {
                    ds.iter()
                        .filter(|d| d.driver.as_deref() == Some("nvidia") && d.count.is_none())
                        .flat_map(|d| d.device_ids.clone().unwrap_or_default())
                        .collect()
                })
                .unwrap_or_default();
            match ids.as_slice() {
                [id] => {
                    if let Some(other) = gpu_ids.insert(id.clone(), c.service) {
                        if other != c.service {
                            p.push(format!("{}: services `{other}` and `{}` both reserve GPU {id}; give each worker its own", s.at(line), c.service));
                        }
                    }
                }
                _ => p.push(format!(
                    "{}: worker service `{}` reserves GPUs {ids:?}; reserve exactly one: deploy.resources.reservations.devices: [{{driver: nvidia, device_ids: [\"N\"], capabilities: [gpu]}}]",
                    s.at(line),
                    c.service
                )),
            }
            if flag(&c.argv, "--gpu").is_some() {
                p.push(format!(
                    "{}: service `{}` passes --gpu, but its container sees only its reserved GPU, as device 0; drop --gpu",
                    c.argv_at, c.service
                ));
            }
        }
    }
    p
}

/// Every `${VARIABLE}` of compose.yaml is documented in .env.example.
fn check_compose_variables(s: &Setup) -> Vec<String> {
    let documented: BTreeSet<&String> = s.vars.keys().collect();
    let mut p = vec![];
    for (var, line) in variables_used(&s.compose_text) {
        if !documented.contains(&var) {
            p.push(format!(
                "{}: ${{{var}}} is not documented in {ENV_EXAMPLE}; add `{var}=<example>` there with a comment saying what it sets",
                s.at(line)
            ));
        }
    }
    for (i, l) in s.env_example_text.lines().enumerate() {
        if let Some((k, _)) = l
            .split_once('=')
            .filter(|_| !l.trim_start().starts_with('#'))
        {
            if !s.compose_text.contains(&format!("${{{}", k.trim())) {
                p.push(format!(
                    "{ENV_EXAMPLE}:{}: {} is not used by {COMPOSE}; remove it",
                    i + 1,
                    k.trim()
                ));
            }
        }
    }
    p
}

/// The build stage's COPYs bring everything cargo needs: they are replayed into an empty
/// folder, where `cargo metadata --locked --offline` must resolve the workspace (a new crate not
/// copied, or a lock file out of date, fails here rather than in `docker build`).
fn check_build_context(s: &Setup) -> Vec<String> {
    fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
        if from.is_dir() {
            std::fs::create_dir_all(to)?;
            for e in std::fs::read_dir(from)? {
                let e = e?;
                if e.file_name() == "target" {
                    continue;
                }
                copy_tree(&e.path(), &to.join(e.file_name()))?;
            }
            Ok(())
        } else {
            if let Some(d) = to.parent() {
                std::fs::create_dir_all(d)?;
            }
            std::fs::copy(from, to).map(|_| ())
        }
    }
    let mut p = vec![];
    for df in s.dockerfiles.values() {
        let Some(stage) = df.stages.iter().find(|st| {
            st.instrs
                .iter()
                .any(|i| i.op == "RUN" && i.args.contains(BUILD_SCRIPT))
        }) else {
            continue; // check_build_command says so
        };
        let dir = tempfile::tempdir().unwrap();
        let mut workdir = PathBuf::from("/");
        for i in &stage.instrs {
            match i.op.as_str() {
                "WORKDIR" => workdir = workdir.join(&i.args),
                "COPY" if !i.args.contains("--from=") => {
                    let words: Vec<&str> = i
                        .args
                        .split_whitespace()
                        .filter(|w| !w.starts_with("--"))
                        .collect();
                    let Some((dest, srcs)) = words.split_last() else {
                        continue;
                    };
                    let into_dir = srcs.len() > 1 || dest.ends_with('/');
                    let dest = dir
                        .path()
                        .join(workdir.join(dest).strip_prefix("/").unwrap());
                    for src in srcs {
                        let to = if into_dir {
                            dest.join(Path::new(src).file_name().unwrap())
                        } else {
                            dest.clone()
                        };
                        if let Err(e) = copy_tree(&s.root.join(src), &to) {
                            p.push(format!("{}:{}: COPY {src}: {e}", df.path, i.line));
                        }
                    }
                }
                _ => {}
            }
        }
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = std::process::Command::new(cargo)
            .args(["metadata", "--format-version", "1", "--locked", "--offline"])
            .current_dir(dir.path().join(workdir.strip_prefix("/").unwrap()))
            .output()
            .expect("running cargo metadata");
        if !out.status.success() {
            p.push(format!(
                "{}:{}: the build stage's COPYs are not enough for cargo (COPY what is missing, e.g. a new workspace crate): {}",
                df.path,
                stage.line,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    p
}

// ---- the tests ---------------------------------------------------------------------------

#[test]
fn build_stage_copies_what_cargo_needs() {
    report(
        "the images' build context",
        check_build_context(&Setup::load()),
    );
}

#[test]
fn images_build_the_binary_with_the_ci_build_script() {
    report("the images' build", check_build_command(&Setup::load()));
}

#[test]
fn runtime_images_are_unprivileged_and_health_checked() {
    report(
        "the images' runtime stages",
        check_runtime_stages(&Setup::load()),
    );
}

#[test]
fn worker_image_has_the_cuda_the_verifier_needs() {
    report("the worker image's CUDA", check_cuda(&Setup::load()));
}

#[test]
fn copied_files_exist_and_pass_the_ignore_files() {
    report("the images' COPY sources", check_copies(&Setup::load()));
}

#[test]
fn compose_commands_parse_with_the_binary() {
    report(
        "compose command lines",
        check_compose_commands(&Setup::load()),
    );
}

#[test]
fn compose_environment_is_read_by_the_binary() {
    report(
        "compose environment",
        check_compose_environment(&Setup::load()),
    );
}

#[test]
fn compose_wiring_holds_together() {
    report("compose wiring", check_compose_wiring(&Setup::load()));
}

#[test]
fn compose_variables_are_documented() {
    report("compose variables", check_compose_variables(&Setup::load()));
}

/// The checks above catch what they claim to: copies of the files, broken on purpose.
#[test]
fn the_checks_catch_broken_files() {
    let good = Setup::load();
    // The introspection finds what the binary reads (else every env check passes vacuously).
    for name in [
        "KERNELIZE_DB",
        "KERNELIZE_SERVER",
        "KERNELIZE_TOKEN_FILE",
        "KERNELIZE_LOG_JSON",
        "KERNELIZE_COMPILE_CACHE",
        "CUDA_HOME",
        "RUST_LOG",
    ] {
        assert!(
            good.reads.contains(name),
            "{name} should be among the variables the binary reads: {:?}",
            good.reads
        );
    }
    assert!(!good.reads.contains("KERNELIZE_NO_SUCH_VARIABLE"));
    assert!(
        good.containers(&mut vec![]).len() >= 4,
        "the hub, the token service and at least one worker (per target) are checked"
    );

    let compose = read(&good.root, COMPOSE);
    let dockerfiles: BTreeMap<String, String> = DOCKERFILES
        .iter()
        .map(|p| (p.to_string(), read(&good.root, p)))
        .collect();
    let broken = |from: &str, to: &str| {
        assert!(
            compose.contains(from),
            "the self-test's anchor `{from}` is gone from {COMPOSE}; update the test"
        );
        Setup::from_texts(
            good.root.clone(),
            compose.replacen(from, to, 1),
            dockerfiles.clone(),
        )
    };
    let line_of = |needle: &str, text: &str| {
        text.lines()
            .position(|l| l.contains(needle))
            .map(|i| i + 1)
            .unwrap()
    };
    let expect = |problems: Vec<String>, wants: &[&str]| {
        assert!(
            problems.iter().any(|p| wants.iter().all(|w| p.contains(w))),
            "expected a problem saying {wants:?}, got {problems:#?}"
        );
    };

    // A misspelt flag in the hub's command.
    let s = broken(
        "\"--kernels\", \"/app/kernels\"]",
        "\"--kernel\", \"/app/kernels\"]",
    );
    let line = line_of("\"--kernel\", ", &s.compose_text);
    expect(
        check_compose_commands(&s),
        &[&format!("{COMPOSE}:{line}"), "service `hub`", "--kernel"],
    );

    // An environment variable the binary does not read.
    let s = broken(
        "      KERNELIZE_LOG_JSON: \"true\"\n      RUST_LOG",
        "      KERNELIZE_LOG_JSONN: \"true\"\n      RUST_LOG",
    );
    let line = line_of("KERNELIZE_LOG_JSONN", &s.compose_text);
    expect(
        check_compose_environment(&s),
        &[
            &format!("{COMPOSE}:{line}"),
            "KERNELIZE_LOG_JSONN",
            "never reads",
        ],
    );

    // A worker pointed at a port the hub does not serve on.
    let s = broken(
        "KERNELIZE_SERVER: http://hub:8080",
        "KERNELIZE_SERVER: http://hub:9090",
    );
    expect(
        check_compose_wiring(&s),
        &["KERNELIZE_SERVER=http://hub:9090", "not a hub of this file"],
    );

    // Two workers on one GPU.
    let s = broken("device_ids: [\"1\"]", "device_ids: [\"0\"]");
    expect(check_compose_wiring(&s), &["both reserve GPU 0"]);

    // The token written where the workers do not look.
    let s = broken(
        "\"--file\", \"/var/lib/kernelize-token/worker.token\"",
        "\"--file\", \"/var/lib/kernelize-token/other.token\"",
    );
    expect(
        check_compose_wiring(&s),
        &["no service runs `kernelize token ensure --file /var/lib/kernelize-token/worker.token`"],
    );

    // An undocumented variable.
    let s = broken("${KERNELIZE_PORT:-8080}", "${KERNELIZE_HUB_PORT:-8080}");
    expect(
        check_compose_variables(&s),
        &["KERNELIZE_HUB_PORT", ENV_EXAMPLE],
    );

    // A runtime stage left running as root, and a health check that does not parse.
    let hub = &dockerfiles["docker/hub.Dockerfile"];
    let mut dfs = dockerfiles.clone();
    dfs.insert(
        "docker/hub.Dockerfile".into(),
        hub.replacen("USER kernelize\n", "", 1).replacen(
            "\"health\", \"--server\"",
            "\"health\", \"--serverr\"",
            1,
        ),
    );
    let s = Setup::from_texts(good.root.clone(), compose.clone(), dfs);
    let problems = check_runtime_stages(&s);
    expect(
        problems.clone(),
        &["docker/hub.Dockerfile:", "stage `hub` runs as root"],
    );
    expect(problems, &["HEALTHCHECK", "--serverr", "does not parse"]);

    // A Dockerfile building with its own cargo command, and copying a file that is not there.
    let mut dfs = dockerfiles.clone();
    dfs.insert(
        "docker/worker.Dockerfile".into(),
        dockerfiles["docker/worker.Dockerfile"]
            .replacen(
                "scripts/build-release && install",
                "cargo build --release && install",
                1,
            )
            .replacen("COPY models /app/models", "COPY model /app/models", 1),
    );
    let s = Setup::from_texts(good.root.clone(), compose, dfs);
    expect(
        check_build_command(&s),
        &["docker/worker.Dockerfile:", "calls `cargo build` itself"],
    );
    expect(
        check_copies(&s),
        &["docker/worker.Dockerfile:", "COPY model: no such file"],
    );

    // A workspace crate left out of the build stage.
    let mut dfs = dockerfiles.clone();
    dfs.insert(
        "docker/hub.Dockerfile".into(),
        dockerfiles["docker/hub.Dockerfile"].replacen("COPY verifier verifier\n", "", 1),
    );
    let s = Setup::from_texts(good.root.clone(), read(&good.root, COMPOSE), dfs);
    expect(
        check_build_context(&s),
        &["docker/hub.Dockerfile:", "not enough for cargo", "verifier"],
    );
}

#[test]
fn interpolation_follows_compose() {
    let vars: BTreeMap<String, String> = [("SET", "x"), ("EMPTY", "")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    for (input, want) in [
        ("${SET}", Ok("x")),
        ("${UNSET:-d}", Ok("d")),
        ("${EMPTY:-d}", Ok("d")),
        ("${EMPTY-d}", Ok("")),
        ("${SET:?needed}", Ok("x")),
        ("$${SET}", Ok("${SET}")),
        ("a$SET/b", Ok("ax/b")),
        ("${SET:+alt}", Ok("alt")),
    ] {
        assert_eq!(interpolate(input, &vars).as_deref(), want, "{input}");
    }
    let err = interpolate("${EMPTY:?set EMPTY in .env}", &vars).unwrap_err();
    assert!(err.contains("set EMPTY in .env"), "{err}");
}
