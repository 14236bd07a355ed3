//! The load probe of issue 17 (run by `scripts/load`): `seed` fills a store with N kernels,
//! each verified, through the store's own API (the path a worker's report takes after the
//! HTTP edge); `run` measures one route of a running `kernelize serve` on a loopback address
//! with a bounded number of concurrent keep-alive clients for a bounded time and count, and
//! prints one JSON line (requests, errors, req/s, p50/p99 latency).

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use kernel_registry::report::tests_support::{case, report_of_cases};
use kernel_registry::report::ULP_INFINITE;
use kernel_registry::{Arch, KernelBundle};
use kernel_store::{Holder, Store};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Store N kernels (copies of the bundled ones under new names) and one verification of
    /// each on sm_90 (every fourth also on sm_100), through a claimed job as a worker does.
    Seed {
        #[arg(long)]
        db: String,
        #[arg(long, default_value_t = 10_000)]
        kernels: usize,
        #[arg(long, default_value = "kernels")]
        templates: PathBuf,
        /// Kernels stored at once (PostgreSQL takes several writers).
        #[arg(long, default_value_t = 1)]
        writers: usize,
    },
    /// GET the paths (round robin; `{n}` in a path becomes the request's number, `{n%M}` that
    /// number modulo M) for at most `seconds` and at most `max_requests`, from `concurrency`
    /// keep-alive clients.
    Run {
        /// Base URL: loopback only.
        #[arg(long)]
        url: String,
        #[arg(long = "path", required = true)]
        paths: Vec<String>,
        #[arg(long, default_value_t = 8)]
        concurrency: usize,
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        #[arg(long, default_value_t = 200_000)]
        max_requests: u64,
        /// A name for the output line.
        #[arg(long)]
        label: String,
    },
    /// Time the parts of the first ask of a ranking and of a policy list on a seeded store
    /// (`policy=ulp:N`, a new N each ask): the verdict index's reads, the answer's JSON; then
    /// what the index's catch-up after one stored kernel and one stored verification costs. Writes that kernel: run it on a copy of the database.
    Profile {
        #[arg(long)]
        db: String,
        #[arg(long, default_value_t = 20)]
        asks: u64,
        #[arg(long, default_value = "kernels")]
        templates: PathBuf,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Seed {
            db,
            kernels,
            templates,
            writers,
        } => seed(&db, kernels, &templates, writers).await,
        Cmd::Run {
            url,
            paths,
            concurrency,
            seconds,
            max_requests,
            label,
        } => run(&url, paths, concurrency, seconds, max_requests, &label).await,
        Cmd::Profile {
            db,
            asks,
            templates,
        } => profile(&db, asks, &templates).await,
    }
}

/// Medians of named timings, in milliseconds.
#[derive(Default)]
struct Timings(Vec<(&'static str, Vec<f64>)>);

impl Timings {
    fn add(&mut self, name: &'static str, t: Instant) {
        let ms = t.elapsed().as_secs_f64() * 1e3;
        match self.0.iter_mut().find(|(n, _)| *n == name) {
            Some((_, v)) => v.push(ms),
            None => self.0.push((name, vec![ms])),
        }
    }
    fn print(&self) {
        for (name, v) in &self.0 {
            let mut v = v.clone();
            v.sort_by(f64::total_cmp);
            println!(
                "{{\"part\": \"{name}\", \"n\": {}, \"median_ms\": {:.3}, \"max_ms\": {:.3}}}",
                v.len(),
                v[v.len() / 2],
                v[v.len() - 1]
            );
        }
    }
}

/// This process's resident memory (Linux; 0 elsewhere).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

async fn profile(db: &str, asks: u64, dir: &std::path::Path) -> anyhow::Result<()> {
    use kernel_registry::{DType, Op, Policy, Semantics};
    use kernel_store::KernelQuery;
    use kernelize::resolve::{ranking, ranking_from, PoolCache, Query};
    let s = Store::open(db).await?;
    let pools = PoolCache::default();
    let mut t = Timings::default();
    let rss_before = rss_kib();
    let t0 = Instant::now();
    let g = s.answer_generation().await?;
    let index = s.verdict_index(g).await?;
    t.add("index: first load (whole store)", t0);
    println!(
        "{{\"part\": \"index: resident memory it added\", \"mib\": {:.0}}}",
        (rss_kib().saturating_sub(rss_before)) as f64 / 1024.0
    );
    for n in 0..asks {
        let policy: Policy = format!("ulp:{}", 1000 + n).parse()?;
        let q = Query {
            op: Op::RmsNorm,
            semantics: Semantics::Llama,
            dtype: DType::Bf16,
            arch: SM90,
            cols: 4096,
            rows: None,
            policy: policy.clone(),
            include_python: false,
            device: None,
        };
        let t0 = Instant::now();
        let c = index.newest_verdicts(q.op, q.semantics, q.arch, q.dtype, &policy);
        t.add("index: newest_verdicts", t0);
        let passing: Vec<i64> = c
            .iter()
            .filter_map(|c| {
                c.on.as_ref()
                    .filter(|v| v.passes)
                    .map(|v| v.verification_id)
            })
            .collect();
        let failing: Vec<i64> = c
            .iter()
            .filter_map(|c| {
                c.on.as_ref()
                    .filter(|v| !v.passes)
                    .map(|v| v.verification_id)
            })
            .take(100)
            .collect();
        let t0 = Instant::now();
        index.coverage_of(&passing, q.dtype);
        t.add("index: coverage_of", t0);
        let t0 = Instant::now();
        index.speeds_of(&passing, q.dtype);
        t.add("index: speeds_of", t0);
        let t0 = Instant::now();
        index.verdict_parts(&failing, q.dtype);
        t.add("index: verdict_parts", t0);
        drop(c);
        let t0 = Instant::now();
        let r = ranking_from(index, &s, &q, None).await?;
        t.add("index: whole ranking", t0);
        let t0 = Instant::now();
        let answer = r.resolution(&s, &q).await?;
        t.add("answer from a ranking (chosen kernel's reads)", t0);
        let t0 = Instant::now();
        let json = serde_json::to_vec(&answer)?;
        t.add("answer's JSON", t0);
        // What `serve` does: the policy over the pool kept for the query's group and width
        // (made by the first ask, then kept until a write).
        let t0 = Instant::now();
        let r = ranking(&s, &q, None, Some(&pools)).await?;
        t.add("index: ranking over a kept pool (a new policy)", t0);
        let t0 = Instant::now();
        let kept = serde_json::to_vec(&r.resolution(&s, &q).await?)?;
        t.add("answer from a ranking over a kept pool", t0);
        anyhow::ensure!(
            kept == json,
            "the kept pool's and the ranking's answers differ"
        );
        let list = KernelQuery::default();
        let t0 = Instant::now();
        let ids = index.approved_ids(&list, &policy);
        t.add("index: approved_ids (whole policy list)", t0);
        let t0 = Instant::now();
        s.kernels_by_ids(&ids[..ids.len().min(100)]).await?;
        t.add("a page of 100 kernels by id", t0);
    }
    // One write, then the catch-up that reads it.
    let ts = templates(dir)?;
    let k = copy_of(&ts[0], 900_000 + (g as usize % 1000))?;
    s.insert_kernel(&k, "submitted", "load-profile").await?;
    let t0 = Instant::now();
    s.verdict_index(s.answer_generation().await?).await?;
    t.add("index: catch-up after a stored kernel", t0);
    s.seed_verification(&k.digest(), &report_of(&k, SM90, 0), None)
        .await?;
    let t0 = Instant::now();
    s.verdict_index(s.answer_generation().await?).await?;
    t.add("index: catch-up after a stored verification", t0);
    t.print();
    Ok(())
}

const SM90: Arch = Arch { major: 9, minor: 0 };
const SM100: Arch = Arch {
    major: 10,
    minor: 0,
};

fn templates(dir: &std::path::Path) -> anyhow::Result<Vec<KernelBundle>> {
    let mut out = vec![];
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("kernel.toml").is_file())
        .collect();
    dirs.sort();
    for d in dirs {
        out.push(KernelBundle::load_dir(&d).with_context(|| format!("{}", d.display()))?);
    }
    if out.is_empty() {
        bail!("no kernel folders in {}", dir.display());
    }
    Ok(out)
}

/// Copy `t` under a new name (and so a new digest).
fn copy_of(t: &KernelBundle, i: usize) -> anyhow::Result<KernelBundle> {
    let name = &t.manifest.name;
    let toml = t.manifest_toml.replacen(
        &format!("name = \"{name}\""),
        &format!("name = \"{name}_load_{i:05}\""),
        1,
    );
    let source = format!("{}\n// load copy {i}\n", t.source);
    Ok(KernelBundle::from_parts(&toml, &source)?)
}

/// A report of `k` on `arch`: every dtype of the kernel at cols 1024, 4096 and 8192 (4096
/// rows), with a class that cycles through bit-exact, 1 ulp, 3 ulp and failing among the copies
/// of each template.
fn report_of(k: &KernelBundle, arch: Arch, i: usize) -> kernel_registry::VerificationReport {
    let (mism, ulp) = [(0, 0), (10, 1), (100, 3), (500, ULP_INFINITE)][(i / 16) % 4];
    let mut cases = vec![];
    for dtype in k.manifest.dtypes() {
        for cols in [1024u64, 4096, 8192] {
            let mut c = case(&format!("{dtype}/4096x{cols}/normal"), dtype, mism, ulp);
            c.cols = cols;
            if let Some(s) = c.speed.as_mut() {
                s.gbps = 1000.0 + ((i * 7919) % 2000) as f64 + cols as f64 / 100.0;
            }
            cases.push(c);
        }
    }
    let mut r = report_of_cases(k, arch, cases);
    r.device.name = "load-seed".into();
    r.suite_version = verifier::cases::SUITE_VERSION.into();
    r
}

async fn seed_one(s: &Store, t: &KernelBundle, i: usize) -> anyhow::Result<()> {
    let k = copy_of(t, i)?;
    s.insert_kernel(&k, "submitted", "load-seed").await?;
    let mut archs = vec![SM90];
    if i.is_multiple_of(4) {
        archs.push(SM100);
    }
    for arch in archs {
        // The job this kernel's store queued (or the arch job below): claimed and completed as
        // a worker's report is, minus the HTTP edge.
        if arch != SM90 {
            s.queue_arch_job(&k.digest(), arch, "load-seed", "load")
                .await?;
        }
        let job = loop {
            let Some(job) = s
                .claim_job_on("load-seed", None, 600_000, Some(arch))
                .await?
            else {
                // Another writer claimed this kernel's job: it completes it.
                break None;
            };
            if job.kernel_digest == k.digest() {
                break Some(job);
            }
            // Another writer's kernel: complete it with its own report.
            complete(s, &job).await?;
        };
        let Some(job) = job else { continue };
        let lease = job.lease_id.clone().expect("a claimed job has a lease");
        let holder = Holder {
            lease_id: &lease,
            token_id: None,
            actor: "load-seed",
        };
        s.complete_job(job.id, &holder, &report_of(&k, arch, i))
            .await?;
    }
    Ok(())
}

async fn complete(s: &Store, job: &kernel_store::JobRow) -> anyhow::Result<()> {
    let k = s
        .kernel_by_digest(&job.kernel_digest)
        .await?
        .expect("stored");
    let i: usize = k
        .name
        .rsplit('_')
        .next()
        .unwrap_or("0")
        .parse()
        .unwrap_or(0);
    let src = s.source(&k.digest).await?.expect("stored");
    let bundle = KernelBundle::from_parts(&src.manifest_toml, &src.source)?;
    let arch = job.arch.unwrap_or(SM90);
    let lease = job.lease_id.clone().expect("lease");
    let holder = Holder {
        lease_id: &lease,
        token_id: None,
        actor: "load-seed",
    };
    s.complete_job(job.id, &holder, &report_of(&bundle, arch, i))
        .await?;
    Ok(())
}

async fn seed(db: &str, n: usize, dir: &std::path::Path, writers: usize) -> anyhow::Result<()> {
    let ts = Arc::new(templates(dir)?);
    let s = Store::open(db).await?;
    let t0 = Instant::now();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = vec![];
    for _ in 0..writers.max(1) {
        let (s, ts, next) = (s.clone(), ts.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    return Ok::<(), anyhow::Error>(());
                }
                seed_one(&s, &ts[i % ts.len()], i).await?;
                if (i + 1) % 1000 == 0 {
                    eprintln!("seeded {} kernels in {:.0?}", i + 1, t0.elapsed());
                }
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    // Jobs left over by writers racing for claims are completed too: every kernel is verified.
    while let Some(job) = s.claim_job_on("load-seed", None, 600_000, None).await? {
        complete(&s, &job).await?;
    }
    let kernels = s.scalar_raw("SELECT COUNT(*) FROM kernels").await?;
    let verified = s
        .scalar_raw("SELECT COUNT(DISTINCT kernel_digest) FROM verifications")
        .await?;
    let verifications = s.scalar_raw("SELECT COUNT(*) FROM verifications").await?;
    println!(
        "{{\"kernels\": {kernels}, \"verified_kernels\": {verified}, \"verifications\": {verifications}, \"seconds\": {:.1}}}",
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `path` with `{n}` replaced by the request's number `n` and `{n%M}` by `n` modulo `M` (a
/// new page each request that stays inside a list of known length).
fn fill(path: &str, n: u64) -> String {
    let mut out = path.replace("{n}", &n.to_string());
    while let Some(i) = out.find("{n%") {
        let Some(j) = out[i..].find('}') else { break };
        let m: u64 = out[i + 3..i + j].parse().unwrap_or(u64::MAX).max(1);
        out.replace_range(i..i + j + 1, &(n % m).to_string());
    }
    out
}

async fn run(
    url: &str,
    paths: Vec<String>,
    concurrency: usize,
    seconds: u64,
    max_requests: u64,
    label: &str,
) -> anyhow::Result<()> {
    let host = reqwest::Url::parse(url)?;
    if !matches!(host.host_str(), Some("127.0.0.1" | "localhost" | "[::1]")) {
        bail!("the load probe only targets loopback addresses, not {url}");
    }
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .timeout(Duration::from_secs(30))
        .build()?;
    let paths = Arc::new(paths);
    let issued = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let t0 = Instant::now();
    let mut tasks = vec![];
    for _ in 0..concurrency {
        let (client, paths, issued, base) = (
            client.clone(),
            paths.clone(),
            issued.clone(),
            url.to_string(),
        );
        tasks.push(tokio::spawn(async move {
            let mut lat_us = vec![];
            let mut errors = 0u64;
            let mut bytes = 0u64;
            while Instant::now() < deadline {
                let n = issued.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if n >= max_requests {
                    break;
                }
                let path = fill(&paths[(n as usize) % paths.len()], n + 1);
                let t = Instant::now();
                match client.get(format!("{base}{path}")).send().await {
                    Ok(r) => {
                        let ok = r.status().is_success();
                        let body = r.bytes().await.map(|b| b.len()).unwrap_or(0);
                        bytes += body as u64;
                        if !ok {
                            errors += 1;
                        }
                    }
                    Err(_) => errors += 1,
                }
                lat_us.push(t.elapsed().as_micros() as u64);
            }
            (lat_us, errors, bytes)
        }));
    }
    let mut lat = vec![];
    let (mut errors, mut bytes) = (0, 0);
    for t in tasks {
        let (l, e, b) = t.await?;
        lat.extend(l);
        errors += e;
        bytes += b;
    }
    let elapsed = t0.elapsed().as_secs_f64();
    lat.sort_unstable();
    let pct = |p: f64| -> f64 {
        if lat.is_empty() {
            return 0.0;
        }
        let i = ((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1;
        lat[i] as f64 / 1000.0
    };
    println!(
        "{}",
        serde_json::json!({
            "label": label,
            "requests": lat.len(),
            "errors": errors,
            "seconds": (elapsed * 100.0).round() / 100.0,
            "rps": (lat.len() as f64 / elapsed).round(),
            "p50_ms": (pct(0.50) * 100.0).round() / 100.0,
            "p99_ms": (pct(0.99) * 100.0).round() / 100.0,
            "mean_bytes": if lat.is_empty() { 0 } else { bytes / lat.len() as u64 },
            "concurrency": concurrency,
        })
    );
    Ok(())
}
