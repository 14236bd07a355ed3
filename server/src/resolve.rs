//! Policy-gated resolution: the fastest kernel whose measured verdict on an architecture meets
//! a policy for a shape — or, when none does, one line per candidate saying why.
//! The HTTP API, the dashboard's policy explorer and the Python client all get this answer,
//! through one entry point, [`Resolver`] (the store and the caches the answers are kept in):
//! its handlers parse the request, call it once and send what it returns.
//!
//! Shape-exact (docs/spec.md section 4): a kernel is handed out only at a width its newest
//! verification on the architecture covered for the dtype — for row-wise ops the row length
//! `cols` itself (a case with that `cols` ran); for elementwise ops (`silu`, `gelu`,
//! `gelu_tanh`, whose ABI takes one element count `n`, the query's `cols`) any `n` up to the
//! largest element count (rows x cols) of a case that ran. The row count never gates: an asked
//! `rows` outside the rows verified at that width is said in the answer's `coverage`. For any
//! other width the answer says which widths were verified; `GET /v1/resolve` queues nothing
//! (a read has no side effect), and an explicit `POST /v1/resolve/verifications` (token scope
//! `submit`) queues a verification of exactly that width (the suite plus the shape), at most one
//! pending per (kernel, width) and at most `max_pending` in all.

use crate::answers::{AnswerCache, GenerationCache};
use crate::error::AppError;
use axum::http::StatusCode;
use bytes::Bytes;
pub use kernel_registry::report::{speed_at, SpeedAt};
use kernel_registry::report::{Coverage, ShapeRequest};
use kernel_registry::{Arch, DType, Op, Policy, Runtime, Semantics};
use kernel_store::{
    CandidateKernel, KernelRow, RankingInput, Store, StoreError, VerdictCheck, VerdictIndex,
    VerdictOn, WidthJob,
};
use serde::Serialize;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

#[derive(Debug, Clone)]
pub struct Query {
    pub op: Op,
    pub semantics: Semantics,
    pub dtype: DType,
    pub arch: Arch,
    pub cols: u64,
    pub rows: Option<u64>,
    pub policy: Policy,
    /// Python candidates (docs/spec.md section 2b) are considered too (`runtime=any`); by default only CUDA
    /// kernels are, since running Python from a hub needs the client's opt-in.
    pub include_python: bool,
    /// The asking GPU's SMs and threads per SM (`sms`, `threads_per_sm`; backward ops only):
    /// eager's column sum for dw is configured from both, so a backward kernel is handed out
    /// only where its verification ran on a GPU with the same figures.
    pub device: Option<(u32, u32)>,
}

/// What the chosen kernel's verification covered at the asked width.
#[derive(Debug, Clone, Serialize)]
pub struct CoverageAt {
    pub dtype: DType,
    /// The asked width: row length (row-wise ops) or element count (elementwise ops).
    pub cols: u64,
    /// `row_length` (a case ran at exactly this `cols`) or `elements` (elementwise: a case
    /// ran with at least this many elements).
    pub rule: &'static str,
    /// Row counts verified at this row length (row-wise ops).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rows_min: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rows_max: Option<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub row_counts: Vec<u64>,
    /// Elementwise ops: the largest element count verified.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_elements: Option<u64>,
    /// Whether the asked `rows` is inside the verified row range (when rows was asked).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rows_in_range: Option<bool>,
    /// Every row length verified for this dtype.
    pub verified_cols: Vec<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// A verification job for an unverified width, queued (or found pending) by this resolve.
#[derive(Debug, Clone, Serialize)]
pub struct QueuedJob {
    pub kernel: String,
    pub digest: kernel_registry::Digest,
    pub job_id: i64,
    pub job_url: String,
    /// `COLS:A..B` as `kernelize verify --shape` takes it.
    pub shape: String,
    /// false: an identical job was already pending and is reused.
    pub new: bool,
}

/// Whether and how a resolve may queue verifications of unverified widths.
#[derive(Debug, Clone)]
pub struct Queueing {
    /// The most width jobs pending at once (all kernels); beyond it nothing is queued.
    pub max_pending: i64,
    /// Who asked (audit log).
    pub actor: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Candidate {
    pub kernel: KernelRow,
    pub verification_id: i64,
    pub device: String,
    /// The GPU's SMs and threads per SM (null: its report does not say): what a backward
    /// kernel's verdict holds for.
    pub device_sm_count: Option<u32>,
    pub device_threads_per_sm: Option<u32>,
    /// When the GPU measured it: the report's own `started_at` (not when this hub stored it).
    pub verified_at: String,
    /// When this hub imported the verification (a bundled or otherwise certified report
    /// measured elsewhere); `None` when this hub's own worker measured it (a job's report).
    pub imported_at: Option<String>,
    pub class: String,
    pub summary: kernel_registry::report::Verdict,
    pub speed: Option<SpeedAt>,
    pub coverage: CoverageAt,
    pub source_url: String,
    /// Why the verdict used is stale (empty: it is not); see `crate::stale`.
    pub stale: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Resolution {
    pub chosen: Option<Candidate>,
    /// Other qualifying kernels, fastest first: the first `MAX_ALSO_QUALIFYING_LISTED`.
    pub also_qualifying: Vec<String>,
    /// How many other kernels qualify in all.
    pub also_qualifying_total: usize,
    /// One line per kernel that was not chosen because it does not qualify: the first
    /// `MAX_EXCLUDED_LISTED` of them (in list order).
    pub excluded: Vec<String>,
    /// How many kernels were excluded in all.
    pub excluded_total: usize,
    /// Verifications of the asked width queued (or pending already) for kernels that would
    /// qualify but were not verified at it.
    pub queued_jobs: Vec<QueuedJob>,
    /// Set when a width was not queued because too many width jobs are pending.
    pub queue_full: Option<String>,
    /// Kernels that meet the policy but were not verified at this width (name version).
    pub unverified_width: Vec<String>,
}

/// Why a backward kernel's verdict `v` does not hold for the asking GPU (`q.device`, which
/// `api::resolve::parse_query` admits for backward ops only): it was measured on a GPU of
/// other SMs or threads per SM, or its report does not say. Only for an op whose verdict
/// depends on them (`Op::verdict_depends_on_device`: rms_norm_backward's dw); an elementwise
/// backward op's (silu_mul_backward) holds on any such GPU of the arch.
fn other_device(q: &Query, v: &VerdictOn) -> Option<String> {
    if !q.op.verdict_depends_on_device() {
        return None;
    }
    let (sms, tps) = q.device?;
    match (v.sm_count, v.threads_per_sm) {
        (Some(s), Some(t)) if (s, t) == (sms, tps) => None,
        (Some(s), Some(t)) => Some(format!(
            "verified on a GPU of {s} SMs x {t} threads per SM ({}); eager's dw order depends on both, and this query asks for {sms} x {tps}: not verified for it (a worker on such a GPU can verify it)",
            v.device_name
        )),
        _ => Some(format!(
            "its verification ({}) does not record the GPU's SMs and threads per SM, which eager's dw order depends on",
            v.device_name
        )),
    }
}

/// Why `k` cannot serve the query at all (wrong dtype, shape or arch), before any verdict.
/// Decided from the stored row: no source is read for it.
fn shape_exclusion(k: &CandidateKernel, q: &Query) -> Option<String> {
    if !k.dtypes.contains(&q.dtype) {
        return Some(format!("has no {} entry", q.dtype));
    }
    k.constraints.not_applicable(q.cols, Some(q.arch))
}

/// Whether `cov` (one verification's coverage for the dtype) covers the asked width; `Err`
/// says which widths it does cover.
pub fn covered_at(op: Op, cov: &[Coverage], q: &Query) -> Result<CoverageAt, String> {
    let mut verified_cols: Vec<u64> = cov.iter().map(|c| c.cols).collect();
    verified_cols.dedup();
    let list = |v: &[u64]| {
        if v.len() <= 12 {
            v.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
        } else {
            let mut s: Vec<String> = v[..6].iter().map(u64::to_string).collect();
            s.push(format!("... ({} widths)", v.len()));
            s.extend(v[v.len() - 3..].iter().map(u64::to_string));
            s.join(", ")
        }
    };
    if cov.is_empty() {
        return Err(format!(
            "its verification on {} ran no {} case; not verified at any width",
            q.arch, q.dtype
        ));
    }
    if op.is_rowwise() {
        let Some(c) = cov.iter().find(|c| c.cols == q.cols) else {
            return Err(format!(
                "verified at cols {} for {} on {}, not at {}",
                list(&verified_cols),
                q.dtype,
                q.arch,
                q.cols
            ));
        };
        let rows_in_range = q.rows.map(|r| (c.rows_min..=c.rows_max).contains(&r));
        let note = (rows_in_range == Some(false)).then(|| {
            format!(
                "rows {} is outside the rows verified at cols {} ({}..{}); the row length was verified, so it is handed out",
                q.rows.unwrap_or_default(),
                c.cols,
                c.rows_min,
                c.rows_max
            )
        });
        Ok(CoverageAt {
            dtype: q.dtype,
            cols: q.cols,
            rule: "row_length",
            rows_min: Some(c.rows_min),
            rows_max: Some(c.rows_max),
            row_counts: c.row_counts.clone(),
            max_elements: None,
            rows_in_range,
            verified_cols,
            note,
        })
    } else {
        let max = cov.iter().map(Coverage::max_elements).max().unwrap_or(0);
        if q.cols > max {
            return Err(format!(
                "verified up to {max} elements for {} on {} (elementwise), not at {}",
                q.dtype, q.arch, q.cols
            ));
        }
        Ok(CoverageAt {
            dtype: q.dtype,
            cols: q.cols,
            rule: "elements",
            rows_min: None,
            rows_max: None,
            row_counts: vec![],
            max_elements: Some(max),
            rows_in_range: None,
            verified_cols,
            note: Some(format!(
                "elementwise (the kernel takes n): verified at element counts up to {max}"
            )),
        })
    }
}

/// The shape to verify for an unverified width: row-wise ops at rows 1..64 (or up to the
/// asked rows), elementwise ops as one row of `cols` elements.
pub fn width_shape(op: Op, q: &Query) -> Result<ShapeRequest, String> {
    if op.is_rowwise() {
        let most = (ShapeRequest::MAX_ELEMENTS / q.cols.max(1)).min(ShapeRequest::MAX_ROWS);
        let rows_max = q.rows.unwrap_or(64).max(64).min(most);
        ShapeRequest::new(q.cols, 1, rows_max.max(1))
    } else {
        ShapeRequest::new(q.cols, 1, 1)
    }
}

/// Resolution's one entry point: the store and the caches its answers are kept in (the
/// application's state holds them; `AppState::resolver`). It answers `GET /v1/resolve`
/// (`answer`), the explicit request to verify a width (`request_verifications`) and the
/// dashboard's policy explorer (`explain`); the handlers only parse and map to a status.
pub struct Resolver<'a> {
    pub store: &'a Store,
    /// Answer texts without `rows`, per query, until the store changes.
    pub answers: &'a AnswerCache,
    /// Rankings per query (every field but `rows`).
    pub rankings: &'a GenerationCache<Arc<Ranking>>,
    /// What rankings are made from, per query but policy, rows and runtime.
    pub pools: &'a PoolCache,
    /// `serve --max-pending-width-jobs`: the most width verifications pending at once.
    pub max_pending: i64,
}

impl Resolver<'_> {
    /// The JSON text of `GET /v1/resolve`'s 200 answer for `query` (parsed from `q`, the
    /// request's parameters), or the 404 problem saying why no kernel qualifies. A read never
    /// queues work.
    pub async fn answer(
        &self,
        q: &HashMap<String, String>,
        query: &Query,
    ) -> Result<Bytes, AppError> {
        let generation = self.store.answer_generation().await?;
        // An answer without `rows` that queued nothing is kept as text until the store changes
        // (`crate::answers`); one with `rows` is derived from the kept ranking of its query (a
        // distinct `rows` per ask would otherwise fill the cache with near-copies).
        let key = AnswerCache::key("/v1/resolve", q);
        let keep_text = query.rows.is_none();
        if keep_text {
            if let Some(a) = self.answers.get(&key, generation) {
                return Ok(a);
            }
        }
        let mut unshaped = q.clone();
        unshaped.remove("rows");
        let ranking_key = AnswerCache::key("/v1/resolve#ranking", &unshaped);
        let rank = match self.rankings.get(&ranking_key, generation) {
            Some(r) => r,
            None => {
                // A read never queues work (`request_verifications` does, when asked).
                let r = Arc::new(
                    ranking_at(self.store, generation, query, None, Some(self.pools)).await?,
                );
                if r.keepable() {
                    self.rankings.insert(ranking_key, generation, r.clone());
                }
                r
            }
        };
        let keep = keep_text && rank.keepable();
        // The answer is its ranking's text for this shape (which case of each kernel is nearest
        // `rows`), kept with the ranking, plus the chosen kernel's coverage of `rows`.
        let shape = rank.shape(query);
        if let Some(coverage) = rank.chosen_coverage(&shape, query)? {
            let text = match rank.kept_text(&shape) {
                Some(t) => t,
                None => {
                    let t = rank
                        .answer_text(self.store, query, &shape)
                        .await?
                        .ok_or_else(|| {
                            AppError::from(kernel_store::StoreError::Corrupt(
                                "a ranking chose a kernel and then did not".into(),
                            ))
                        })?;
                    rank.keep_text(shape, t.clone());
                    t
                }
            };
            let answer = with_field(&text, "coverage", &coverage);
            let answer = with_field(&answer, "semantics", &query.semantics);
            let answer = with_field(&answer, "semantics_defaulted", &semantics_defaulted(q));
            if keep {
                self.answers.insert(key, generation, answer.clone());
            }
            return Ok(answer);
        }
        let r = rank.resolution_at(self.store, query, &shape).await?;
        match r.chosen {
            Some(_) => Err(AppError::from(kernel_store::StoreError::Corrupt(
                "a ranking chose no kernel and then did".into(),
            ))),
            None => {
                let n = r.excluded_total;
                let defaulted = semantics_defaulted(q);
                let detail = if n == 0 {
                    format!(
                        "no kernel is registered for {} ({}); keep your reference layer",
                        query.op, query.semantics
                    )
                } else {
                    let more = if n > r.excluded.len() {
                        format!(" (the first {} of {n})", r.excluded.len())
                    } else {
                        String::new()
                    };
                    let ask = if r.unverified_width.is_empty() {
                        String::new()
                    } else {
                        format!(
                            " {} meet the policy but were not verified at this width; nothing was queued: a token with scope `submit` asks for a verification of it with POST {REQUEST_PATH} and this query as its JSON body (`request_verification`).",
                            r.unverified_width.join(", ")
                        )
                    };
                    format!(
                        "no kernel meets `{}` for {} ({}) {} on {} at cols={}; keep your reference layer. Why each is out{more}: {}{ask}",
                        query.policy, query.op, query.semantics, query.dtype, query.arch, query.cols,
                        r.excluded.join(" | ")
                    )
                };
                let detail = match defaulted_note(query, defaulted) {
                    Some(note) => format!("{detail} {note}"),
                    None => detail,
                };
                let mut e = AppError::not_found(detail)
                    .with("excluded", r.excluded)
                    .with("excluded_total", r.excluded_total)
                    .with("unverified_width", r.unverified_width.clone())
                    .with("queued_jobs", serde_json::json!([]))
                    .with("semantics", query.semantics.as_str())
                    .with("semantics_defaulted", defaulted);
                if !r.unverified_width.is_empty() {
                    e = e.with("request_verification", request_of(q));
                }
                Err(e)
            }
        }
    }

    /// `POST /v1/resolve/verifications`: queue a verification of `query`'s width for every
    /// kernel that meets the policy but was not verified there (`actor` asked); the status
    /// (201 when one was queued, else 200) and the answer's body.
    pub async fn request_verifications(
        &self,
        query: &Query,
        actor: String,
    ) -> Result<(StatusCode, serde_json::Value), AppError> {
        let queueing = Queueing {
            max_pending: self.max_pending,
            actor,
        };
        let generation = self.store.answer_generation().await?;
        let rank = ranking_at(self.store, generation, query, Some(&queueing), None).await?;
        let r = rank
            .resolution_at(self.store, query, &rank.shape(query))
            .await?;
        let new = r.queued_jobs.iter().any(|j| j.new);
        let status = if new {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        };
        let detail = if r.unverified_width.is_empty() {
            "no kernel that meets the policy lacks a verification of this width: nothing to queue"
                .to_string()
        } else if let Some(full) = &r.queue_full {
            format!("not every verification was queued: {full}")
        } else {
            format!(
                "verifications of cols={} are pending for {}: poll each job_url, then GET /v1/resolve again once it is done",
                query.cols,
                r.queued_jobs
                    .iter()
                    .map(|j| format!("{} (job {})", j.kernel, j.job_url))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        Ok((
            status,
            serde_json::json!({
                "detail": detail,
                "queued_jobs": r.queued_jobs,
                "queue_full": r.queue_full,
                "unverified_width": r.unverified_width,
                "excluded": r.excluded,
            }),
        ))
    }

    /// The whole resolution of `query` without queueing anything or keeping it (the
    /// dashboard's explorer: the chosen kernel and why each other one is out).
    pub async fn explain(&self, query: &Query) -> Result<Resolution, StoreError> {
        ranking(self.store, query, None, None)
            .await?
            .resolution(self.store, query)
            .await
    }
}

/// Whether the query left `semantics` out (the op's default, named in the answer's
/// `semantics`, was used: `llama` for rms_norm, which has several).
fn semantics_defaulted(q: &HashMap<String, String>) -> bool {
    !q.contains_key("semantics")
}

/// What a refusal says when `semantics` was left out for an op that has several.
fn defaulted_note(query: &Query, defaulted: bool) -> Option<String> {
    let all = query.op.semantics();
    (defaulted && all.len() > 1).then(|| {
        format!(
            "`semantics` was not given: {} was used, the default of {} (one of {}; pass semantics= to choose).",
            query.semantics,
            query.op,
            all.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
        )
    })
}

/// The path of the explicit request that queues width verifications.
pub const REQUEST_PATH: &str = "/v1/resolve/verifications";

/// How to ask for verifications of the width of the resolve query `q` (its parameters).
fn request_of(q: &HashMap<String, String>) -> serde_json::Value {
    let mut body = serde_json::Map::new();
    for (k, v) in q {
        let value = match k.as_str() {
            "cols" | "rows" | "sms" | "threads_per_sm" => v
                .parse::<u64>()
                .map(serde_json::Value::from)
                .unwrap_or_else(|_| v.clone().into()),
            _ => v.clone().into(),
        };
        body.insert(k.clone(), value);
    }
    serde_json::json!({
        "method": "POST",
        "url": REQUEST_PATH,
        "scope": "submit",
        "body": body,
    })
}

/// `object` (the JSON text of a non-empty object) with `field` set to `value` appended.
fn with_field(object: &[u8], field: &str, value: &impl serde::Serialize) -> Bytes {
    let mut out = Vec::with_capacity(object.len() + 512);
    out.extend_from_slice(object.strip_suffix(b"}").expect("a JSON object"));
    out.push(b',');
    serde_json::to_writer(&mut out, field).expect("a key serialises");
    out.push(b':');
    serde_json::to_writer(&mut out, value).expect("a value serialises");
    out.push(b'}');
    Bytes::from(out)
}

/// A kernel of a pool verified on its architecture, with what ranking it by a shape and
/// answering with it need.
#[derive(Debug, Clone)]
struct Qualifying {
    /// `name version`.
    label: Arc<str>,
    digest: kernel_registry::Digest,
    /// Its newest verdict on the arch (`passes` is not read: the policy is checked by
    /// `Passes`).
    verdict: VerdictOn,
    /// Its verification's coverage of the dtype.
    coverage: Arc<[Coverage]>,
    /// Its verification's timed cases of the dtype, in case order (shared with the verdict
    /// index).
    cases: Arc<[SpeedAt]>,
    /// Where the shapes of its cases are in `Pool::layouts` (covered kernels only).
    layout: usize,
}

/// `k`'s `also_qualifying` line when `speed` is its nearest case (written for the lines listed
/// only: a group's kernels have thousands of cases).
fn also_line(k: &Qualifying, speed: &SpeedAt) -> String {
    format!(
        "{}: qualifies, slower ({:.0} GB/s at {}x{})",
        k.label, speed.gbps, speed.rows, speed.cols
    )
}

/// The shapes of a kernel's timed cases, in case order, as ranking by them needs: each
/// one's distance from the query's `cols` (as `nearest_speed` computes it) and where its row
/// count is in `Pool::case_rows`. Kernels verified by one suite share one.
type Layout = Vec<(f64, usize)>;

/// Which timed case of each layout is nearest a query's rows x cols (`None`: it has none), so
/// of each covered kernel: all of an answer that `rows` decides, but for the chosen kernel's
/// row coverage.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Shape(Vec<Option<u32>>);

/// The most answer texts a ranking keeps (one per `Shape`: a few per ranking, one when every
/// timed case ran one row count; past the bound they are dropped and made again in memory).
const MAX_TEXTS_PER_RANKING: usize = 8;

/// The most speed orders a pool keeps (one per `Shape`, as the texts).
const MAX_ORDERS_PER_POOL: usize = 64;

/// What the answer shows of a chosen kernel beyond its ranking's row, read once per pool.
#[derive(Debug)]
struct ChosenParts {
    kernel: KernelRow,
    verdict: kernel_registry::report::Verdict,
    stale: Vec<String>,
    times: Times,
}

/// When a verification was measured and (if it was not measured by this hub's worker) imported.
#[derive(Debug, Clone)]
pub struct Times {
    /// The report's own `started_at`: when the GPU ran it.
    pub verified_at: String,
    /// When this hub stored a verification that no job of its own produced (an imported
    /// certificate); `None` for a worker's report.
    pub imported_at: Option<String>,
}

impl Times {
    /// The times of a stored verification.
    pub fn of(v: &kernel_store::VerificationRow) -> Times {
        Times {
            verified_at: v.verified_at.clone(),
            imported_at: v.imported_at.clone(),
        }
    }
}

/// A resolve answer's speed: the timed case nearest the asked shape, labelled with the shape it
/// was measured at and whether that is the asked width (the fields of `SpeedAt` kept as they
/// were, so older clients read it unchanged).
#[derive(Debug, Clone, Serialize)]
pub struct AnswerSpeed {
    #[serde(flatten)]
    pub speed: SpeedAt,
    /// The shape this figure was measured at (the same as `rows` and `cols`, said outright).
    pub measured_at: MeasuredAt,
    /// Whether it was measured at the asked width: row-wise ops a case of exactly the asked
    /// `cols`, elementwise ops a case of exactly the asked element count (rows x cols).
    pub asked_width_measured: bool,
    /// Whether it was measured at the asked `rows` (row-wise ops; absent when rows was not
    /// asked or the op is elementwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub asked_rows_measured: Option<bool>,
    /// Absent when the figure is the asked width's; else which shape it is and that no speed
    /// was measured at the asked width.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct MeasuredAt {
    pub rows: u64,
    pub cols: u64,
}

impl AnswerSpeed {
    /// `speed` labelled for the query `q`.
    pub fn label(speed: &SpeedAt, q: &Query) -> AnswerSpeed {
        let at_width = if q.op.is_rowwise() {
            speed.cols == q.cols
        } else {
            speed.rows.saturating_mul(speed.cols) == q.cols
        };
        let asked_rows_measured = q
            .rows
            .filter(|_| q.op.is_rowwise())
            .map(|r| r == speed.rows);
        let note = (!at_width).then(|| {
            let asked = if q.op.is_rowwise() {
                format!("cols={}", q.cols)
            } else {
                format!("{} elements", q.cols)
            };
            format!(
                "measured at {}x{} (rows x cols), the nearest timed case: no speed was measured at the asked {asked}",
                speed.rows, speed.cols
            )
        });
        AnswerSpeed {
            speed: speed.clone(),
            measured_at: MeasuredAt {
                rows: speed.rows,
                cols: speed.cols,
            },
            asked_width_measured: at_width,
            asked_rows_measured,
            note,
        }
    }
}

/// How a pool entry's verdict meets a policy.
#[derive(Debug)]
enum Passes {
    /// Decided for the one policy the pool was made for (`ranking_from`; the tests' rankings
    /// by `Policy::evaluate` on the full reports).
    Read(bool),
    /// Checked in memory for any policy (`None`: no verdict of the dtype, so none passes).
    Check(Option<VerdictCheck>),
}

impl Passes {
    fn passes(&self, policy: &Policy) -> bool {
        match self {
            Passes::Read(p) => *p,
            Passes::Check(c) => c.as_ref().is_some_and(|c| c.passes(policy)),
        }
    }
}

/// One candidate of a pool, in list order: what the policy does not decide.
#[derive(Debug)]
struct PoolEntry {
    label: Arc<str>,
    python: bool,
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    /// Out whatever the policy (it cannot serve the shape, or was never verified on the
    /// arch): its excluded line.
    Out(String),
    Verified {
        k: Box<Qualifying>,
        passes: Passes,
        /// `Err`: why its coverage does not reach the asked width.
        covered: Result<(), String>,
    },
}

/// The candidates of an op group on one (arch, dtype, width), each with its newest verdict
/// there, its coverage of the width and its timed cases: everything of a ranking but the
/// policy's check, so a ranking for any policy is one pass over it in memory. The server keeps
/// pools per answer generation (`PoolCache`); a policy never seen before then costs that pass,
/// not a read of the group.
#[derive(Debug)]
pub struct Pool {
    entries: Vec<PoolEntry>,
    /// Every row count of the covered kernels' timed cases, sorted.
    case_rows: Vec<u64>,
    /// The distinct layouts of the covered kernels' timed cases.
    layouts: Vec<Layout>,
    /// Per shape: the covered entries, fastest first (list order among equals).
    orders: Mutex<HashMap<Shape, Arc<[u32]>>>,
    /// The chosen kernels' rows, verdicts and staleness, by verification id, as they are read.
    chosen: Mutex<HashMap<i64, Arc<ChosenParts>>>,
}

/// Pools kept per answer generation, by `Pool::key`.
pub type PoolCache = crate::answers::GenerationCache<Arc<Pool>>;

impl Pool {
    /// The key of `q`'s pool: the query without its policy, rows and runtime.
    pub fn key(q: &Query) -> String {
        format!("{}|{}|{}|{}|{}", q.op, q.semantics, q.arch, q.dtype, q.cols)
    }

    /// The pool of `q`'s group from `inputs` (list order).
    fn new(inputs: Vec<(RankingInput, Passes)>, q: &Query) -> Pool {
        let mut entries = Vec::with_capacity(inputs.len());
        for (input, passes) in inputs {
            let c = input.candidate;
            let k = c.kernel;
            let label: Arc<str> = Arc::from(format!("{} {}", k.name, k.version));
            let python = k.runtime == Runtime::Python;
            let kind = if let Some(why) = shape_exclusion(&k, q) {
                Kind::Out(format!("{label}: {why}"))
            } else {
                match c.on {
                    None if c.elsewhere.is_empty() => Kind::Out(format!(
                        "{label}: never verified; a kernel that was never verified is never handed out"
                    )),
                    None => {
                        let on: Vec<String> = c.elsewhere.iter().map(|a| a.to_string()).collect();
                        Kind::Out(format!(
                            "{label}: not verified on {} (only on {})",
                            q.arch,
                            on.join(", ")
                        ))
                    }
                    Some(v) => Kind::Verified {
                        covered: covered_at(q.op, &input.coverage, q).map(|_| ()),
                        k: Box::new(Qualifying {
                            label: label.clone(),
                            digest: k.digest.clone(),
                            verdict: v,
                            coverage: input.coverage,
                            cases: input.speeds,
                            layout: usize::MAX,
                        }),
                        passes,
                    },
                }
            };
            entries.push(PoolEntry {
                label,
                python,
                kind,
            });
        }
        let mut case_rows: Vec<u64> = entries
            .iter()
            .filter_map(Self::covered)
            .flat_map(|k| k.cases.iter().map(|s| s.rows))
            .collect();
        case_rows.sort_unstable();
        case_rows.dedup();
        let mut layouts: Vec<Layout> = vec![];
        let mut layout_of: HashMap<Vec<(u64, usize)>, usize> = HashMap::new();
        for e in &mut entries {
            let Kind::Verified {
                k, covered: Ok(()), ..
            } = &mut e.kind
            else {
                continue;
            };
            let layout: Layout = k
                .cases
                .iter()
                .map(|s| {
                    let cols_distance = ((s.cols.max(1) as f64) / (q.cols.max(1) as f64))
                        .log2()
                        .abs();
                    let rows_at = case_rows.binary_search(&s.rows).unwrap_or_default();
                    (cols_distance, rows_at)
                })
                .collect();
            let bits = layout.iter().map(|(d, r)| (d.to_bits(), *r)).collect();
            k.layout = *layout_of.entry(bits).or_insert_with(|| {
                layouts.push(layout);
                layouts.len() - 1
            });
        }
        Pool {
            entries,
            case_rows,
            layouts,
            orders: Mutex::default(),
            chosen: Mutex::default(),
        }
    }

    /// The entry's kernel if it is verified and covers the width.
    fn covered(e: &PoolEntry) -> Option<&Qualifying> {
        match &e.kind {
            Kind::Verified {
                k, covered: Ok(()), ..
            } => Some(k),
            _ => None,
        }
    }

    /// Entry `i`'s kernel (`i` from `order` or a ranking's members: a covered entry).
    fn kernel(&self, i: u32) -> &Qualifying {
        Self::covered(&self.entries[i as usize]).expect("a ranked entry is covered")
    }

    /// The covered entries fastest first by their nearest case for `shape` (a stable sort:
    /// list order among equals), made once per shape.
    fn order(&self, shape: &Shape) -> Arc<[u32]> {
        if let Some(o) = self.orders_lock().get(shape) {
            return o.clone();
        }
        let g = |i: &u32| Ranking::case_of(self.kernel(*i), shape).map_or(0.0, |c| c.gbps);
        let mut order: Vec<u32> = (0..self.entries.len() as u32)
            .filter(|i| Self::covered(&self.entries[*i as usize]).is_some())
            .collect();
        order.sort_by(|a, b| g(b).total_cmp(&g(a)));
        let order: Arc<[u32]> = Arc::from(order);
        let mut orders = self.orders_lock();
        if orders.len() >= MAX_ORDERS_PER_POOL {
            orders.clear();
        }
        orders.insert(shape.clone(), order.clone());
        order
    }

    // A panic while holding either lock leaves a map of complete entries: still good to read.
    fn orders_lock(&self) -> std::sync::MutexGuard<'_, HashMap<Shape, Arc<[u32]>>> {
        self.orders.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn chosen_lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Arc<ChosenParts>>> {
        self.chosen.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The part of a resolve that the store decides: which kernels qualify for (op, semantics,
/// dtype, arch, width, policy, runtime), with their speeds, and why each other one is out.
/// The asked `rows` plays no part in it (it never gates, docs/spec.md section 4): it only picks each
/// kernel's nearest measured speed, so `Ranking::resolution` answers any `rows` from one
/// ranking in memory. A ranking that queued nothing (`Ranking::keepable`) stays right while
/// the store's answer generation does (`crate::answers`).
#[derive(Debug)]
pub struct Ranking {
    pool: Arc<Pool>,
    /// Per pool entry: whether it qualifies (meets the policy and covers the width).
    member: Vec<bool>,
    /// How many do.
    qualifying_total: usize,
    excluded: Vec<String>,
    excluded_total: usize,
    queued_jobs: Vec<QueuedJob>,
    queue_full: Option<String>,
    unverified_width: Vec<String>,
    /// Answer texts without the chosen kernel's coverage, per shape (`crate::api::resolve`).
    texts: Mutex<HashMap<Shape, bytes::Bytes>>,
}

/// The store's part of resolving `q`: every candidate with its newest verdict on the arch,
/// coverage and speeds, from the store's verdict index (in memory, brought to the store's
/// answer generation) as a `Pool` (kept in `pools` per generation when given), then the
/// policy's check of each and the verdicts of the failing lines listed. Queues verifications
/// of an unverified width when `queueing` allows (a ranking that did is not `keepable`).
pub async fn ranking(
    store: &Store,
    q: &Query,
    queueing: Option<&Queueing>,
    pools: Option<&PoolCache>,
) -> Result<Ranking, StoreError> {
    let generation = store.answer_generation().await?;
    ranking_at(store, generation, q, queueing, pools).await
}

/// `ranking` at the answer `generation` the caller read (the store's now, or older).
pub async fn ranking_at(
    store: &Store,
    generation: i64,
    q: &Query,
    queueing: Option<&Queueing>,
    pools: Option<&PoolCache>,
) -> Result<Ranking, StoreError> {
    let index = store.verdict_index(generation).await?;
    let key = Pool::key(q);
    let pool = match pools.and_then(|p| p.get(&key, generation)) {
        Some(p) => p,
        None => {
            let inputs = index
                .policy_free_inputs(q.op, q.semantics, q.arch, q.dtype)
                .into_iter()
                .map(|(i, check)| (i, Passes::Check(check)))
                .collect();
            let p = Arc::new(Pool::new(inputs, q));
            if let Some(pools) = pools {
                pools.insert(key, generation, p.clone());
            }
            p
        }
    };
    rank(pool, index, store, q, queueing).await
}

/// `ranking` with its candidates read from the verdict `index` for `q`'s policy alone (each
/// candidate's check made as it is read): a pool made for one policy, not kept.
pub async fn ranking_from(
    index: &VerdictIndex,
    store: &Store,
    q: &Query,
    queueing: Option<&Queueing>,
) -> Result<Ranking, StoreError> {
    let inputs = index
        .ranking_inputs(q.op, q.semantics, q.arch, q.dtype, &q.policy)
        .into_iter()
        .map(|i| {
            let passes = Passes::Read(i.candidate.on.as_ref().is_some_and(|v| v.passes));
            (i, passes)
        })
        .collect();
    rank(Arc::new(Pool::new(inputs, q)), index, store, q, queueing).await
}

/// `q`'s policy over `pool`: which kernels qualify, and why each other one is out.
async fn rank(
    pool: Arc<Pool>,
    index: &VerdictIndex,
    store: &Store,
    q: &Query,
    queueing: Option<&Queueing>,
) -> Result<Ranking, StoreError> {
    let wanted = q.policy.confirmations as i64;
    let mut excluded = Excluded::default();
    let mut queued_jobs = Vec::new();
    let mut queue_full = None;
    let mut unverified_width = Vec::new();
    let mut member = vec![false; pool.entries.len()];
    let mut qualifying_total = 0;
    for (i, e) in pool.entries.iter().enumerate() {
        let label = &e.label;
        if e.python && !q.include_python {
            excluded.push(|| format!(
                "{label}: a Python candidate (runtime = \"python\"); ask with runtime=any to consider Python candidates (a client runs them only when its caller opts in)"
            ));
            continue;
        }
        let (k, covered) = match &e.kind {
            Kind::Out(line) => {
                excluded.push(|| line.clone());
                continue;
            }
            Kind::Verified { k, passes, covered } => {
                if !passes.passes(&q.policy) {
                    // Why, from its verdict: read after the loop for the lines listed.
                    excluded.push_why_not(label.to_string(), k.verdict.verification_id);
                    continue;
                }
                (k, covered)
            }
        };
        let v = &k.verdict;
        if let Some(why) = other_device(q, v) {
            excluded.push(|| format!("{label}: {why}"));
            continue;
        }
        if v.certifying_keys < wanted {
            excluded.push(|| format!(
                "{label}: {} worker key(s) certify class {} on {}, the policy asks for {wanted} (confirmed:{wanted}): independent workers with their own registered keys must verify it",
                v.certifying_keys, v.class, q.arch
            ));
            continue;
        }
        let Err(why) = covered else {
            member[i] = true;
            qualifying_total += 1;
            continue;
        };
        unverified_width.push(label.to_string());
        let mut line = format!("{label}: {why}");
        let shape = width_shape(q.op, q);
        let asked_before = v.requested_cols.contains(&q.cols);
        match (queueing, shape) {
            (_, Err(e)) => line.push_str(&format!("; cannot queue a verification of this width: {e}")),
            (_, Ok(_)) if asked_before => line.push_str(&format!(
                "; verification {} was asked for cols {} and did not cover it (its cases there did not run), so it is not queued again: see /v1/verifications/{}",
                v.verification_id, q.cols, v.verification_id
            )),
            (None, Ok(_)) => line.push_str(
                "; POST /v1/resolve/verifications with this query (token scope submit) queues a verification of it",
            ),
            (Some(qu), Ok(shape)) => {
                let outcome = store
                    .queue_width_job(&k.digest, shape, q.arch, qu.max_pending, &qu.actor)
                    .await?;
                let (j, new) = match outcome {
                    WidthJob::Queued(j) => (j, true),
                    WidthJob::Existing(j) => (j, false),
                    WidthJob::CapReached(n) => {
                        let why = format!(
                            "{n} verifications of unverified widths are pending (the cap); nothing more is queued until workers finish some: ask again later"
                        );
                        line.push_str(&format!("; not queued: {why}"));
                        queue_full = Some(why);
                        excluded.push(|| line);
                        continue;
                    }
                };
                let shown = j.shapes.first().copied().unwrap_or(shape);
                line.push_str(&format!(
                    "; a verification of {shown} is {} (job {}, /v1/jobs/{})",
                    j.state,
                    j.id,
                    j.id
                ));
                queued_jobs.push(QueuedJob {
                    kernel: label.to_string(),
                    digest: k.digest.clone(),
                    job_id: j.id,
                    job_url: format!("/v1/jobs/{}", j.id),
                    shape: shown.to_string(),
                    new,
                });
            }
        }
        excluded.push(|| line);
    }
    // The verdicts of the failing lines listed.
    let mut parts = index.verdict_parts(&excluded.why_not_ids(), q.dtype);
    let excluded_total = excluded.total;
    Ok(Ranking {
        pool,
        member,
        qualifying_total,
        excluded: excluded.render(&mut parts, q),
        excluded_total,
        queued_jobs,
        queue_full,
        unverified_width,
        texts: Mutex::default(),
    })
}

impl Ranking {
    /// Whether this ranking may be kept for later asks: it queued nothing and found every
    /// policy-meeting kernel verified at the width (so nothing in it depends on `rows`).
    pub fn keepable(&self) -> bool {
        self.queued_jobs.is_empty() && self.unverified_width.is_empty() && self.queue_full.is_none()
    }

    /// Which timed case of each qualifying kernel is nearest `q`'s rows x cols: what
    /// `nearest_speed` picks, from distances computed once per ranking (cols) and once per
    /// row count (rows).
    pub fn shape(&self, q: &Query) -> Shape {
        let rows_distance: Vec<f64> = self
            .pool
            .case_rows
            .iter()
            .map(|&c| {
                q.rows
                    .map(|r| ((c.max(1) as f64) / (r.max(1) as f64)).log2().abs() * 0.5)
                    .unwrap_or(0.0)
            })
            .collect();
        Shape(
            self.pool
                .layouts
                .iter()
                .map(|layout| {
                    // The first of equally near cases, as `Iterator::min_by` keeps it.
                    let mut best: Option<(u32, f64)> = None;
                    for (i, (cols_distance, rows_at)) in layout.iter().enumerate() {
                        let d = cols_distance + rows_distance[*rows_at];
                        if best.is_none_or(|(_, b)| d.total_cmp(&b).is_lt()) {
                            best = Some((i as u32, d));
                        }
                    }
                    best.map(|(i, _)| i)
                })
                .collect(),
        )
    }

    /// `k`'s nearest case for `shape`.
    fn case_of<'a>(k: &'a Qualifying, shape: &Shape) -> Option<&'a SpeedAt> {
        shape.0[k.layout].map(|i| &k.cases[i as usize])
    }

    /// The qualifying kernels, in list order.
    #[cfg(test)]
    fn qualifying(&self) -> impl Iterator<Item = &Qualifying> + '_ {
        (0..self.member.len() as u32)
            .filter(|i| self.member[*i as usize])
            .map(|i| self.pool.kernel(i))
    }

    /// The chosen kernel's coverage of `q`'s shape (`None`: nothing qualifies): the one part
    /// of an answer that `shape` does not decide.
    pub fn chosen_coverage(
        &self,
        shape: &Shape,
        q: &Query,
    ) -> Result<Option<CoverageAt>, StoreError> {
        // The first of the fastest, as `ranked` puts it first.
        let order = self.pool.order(shape);
        let chosen = order.iter().find(|i| self.member[**i as usize]);
        chosen
            .map(|i| Self::coverage_of(self.pool.kernel(*i), q))
            .transpose()
    }

    fn coverage_of(k: &Qualifying, q: &Query) -> Result<CoverageAt, StoreError> {
        covered_at(q.op, &k.coverage, q).map_err(|why| {
            StoreError::Corrupt(format!(
                "{} qualified at cols {} and then did not: {why}",
                k.label, q.cols
            ))
        })
    }

    /// The answer text kept for `shape`, if any.
    pub fn kept_text(&self, shape: &Shape) -> Option<bytes::Bytes> {
        self.texts_lock().get(shape).cloned()
    }

    /// Keep an answer text for `shape` (at most `MAX_TEXTS_PER_RANKING`).
    pub fn keep_text(&self, shape: Shape, text: bytes::Bytes) {
        let mut texts = self.texts_lock();
        if texts.len() >= MAX_TEXTS_PER_RANKING {
            texts.clear();
        }
        texts.insert(shape, text);
    }

    /// The answer for `q` (the query this ranking was made for, with any `rows`): the
    /// qualifying kernels ranked by their speed nearest `rows` x `cols`, the fastest chosen.
    /// Reads the store only for a chosen kernel not chosen before from this ranking.
    pub async fn resolution(&self, store: &Store, q: &Query) -> Result<Resolution, StoreError> {
        self.resolution_at(store, q, &self.shape(q)).await
    }

    /// `resolution` for `shape` (`self.shape(q)`).
    pub async fn resolution_at(
        &self,
        store: &Store,
        q: &Query,
        shape: &Shape,
    ) -> Result<Resolution, StoreError> {
        let (chosen, also_qualifying, also_qualifying_total) =
            self.ranked_at(store, q, shape).await?;
        Ok(Resolution {
            chosen,
            also_qualifying,
            also_qualifying_total,
            excluded: self.excluded.clone(),
            excluded_total: self.excluded_total,
            queued_jobs: self.queued_jobs.clone(),
            queue_full: self.queue_full.clone(),
            unverified_width: self.unverified_width.clone(),
        })
    }

    /// `/v1/resolve`'s answer for `q` at `shape` as JSON text, without the chosen kernel's
    /// coverage (the caller adds it for `q`'s rows); `None` when nothing qualifies. Written
    /// from the ranking's parts as they are (no copy of its lines).
    pub async fn answer_text(
        &self,
        store: &Store,
        q: &Query,
        shape: &Shape,
    ) -> Result<Option<bytes::Bytes>, StoreError> {
        let (chosen, also_qualifying, also_qualifying_total) =
            self.ranked_at(store, q, shape).await?;
        let Some(c) = chosen else {
            return Ok(None);
        };
        let answer = Answer {
            also_qualifying: &also_qualifying,
            also_qualifying_total,
            class: &c.class,
            device: &c.device,
            device_sm_count: c.device_sm_count,
            device_threads_per_sm: c.device_threads_per_sm,
            digest: &c.kernel.digest,
            excluded: &self.excluded,
            excluded_total: self.excluded_total,
            kernel: &c.kernel,
            policy: q.policy.to_string(),
            queue_full: &self.queue_full,
            queued_jobs: &self.queued_jobs,
            runtime: c.kernel.runtime,
            source_url: &c.source_url,
            speed: c.speed.as_ref().map(|s| AnswerSpeed::label(s, q)),
            // The newest verdict on this architecture, stale or not: why it is stale, if so
            // (`kernelize verify-request --stale` queues its re-verification).
            stale: &c.stale,
            summary: &c.summary,
            verification_id: c.verification_id,
            verification_url: format!("/v1/verifications/{}", c.verification_id),
            verified_at: &c.verified_at,
            imported_at: &c.imported_at,
        };
        Ok(Some(bytes::Bytes::from(
            serde_json::to_vec(&answer).expect("an answer serialises"),
        )))
    }

    /// The chosen kernel at `shape`, the lines of the next `MAX_ALSO_QUALIFYING_LISTED`
    /// fastest, and how many others qualify.
    async fn ranked_at(
        &self,
        store: &Store,
        q: &Query,
        shape: &Shape,
    ) -> Result<(Option<Candidate>, Vec<String>, usize), StoreError> {
        let listed: Vec<(&Qualifying, Option<&SpeedAt>)> = self
            .pool
            .order(shape)
            .iter()
            .filter(|i| self.member[**i as usize])
            .take(1 + MAX_ALSO_QUALIFYING_LISTED)
            .map(|i| {
                let k = self.pool.kernel(*i);
                (k, Self::case_of(k, shape))
            })
            .collect();
        let mut it = listed.into_iter();
        let Some((k, case)) = it.next() else {
            return Ok((None, vec![], 0));
        };
        let parts = self.chosen_parts(store, k, q).await?;
        let chosen = candidate(
            parts.kernel.clone(),
            &k.verdict,
            parts.verdict.clone(),
            Self::coverage_of(k, q)?,
            case.cloned(),
            parts.stale.clone(),
            parts.times.clone(),
        );
        let also_qualifying = it
            .map(|(k, case)| match case {
                Some(c) => also_line(k, c),
                None => format!("{}: qualifies, slower (no speed measured)", k.label),
            })
            .collect();
        Ok((Some(chosen), also_qualifying, self.qualifying_total - 1))
    }

    /// `k`'s stored row, its verdict for the dtype and why it is stale: read on its first
    /// choice from this ranking's pool, kept with the pool after.
    async fn chosen_parts(
        &self,
        store: &Store,
        k: &Qualifying,
        q: &Query,
    ) -> Result<Arc<ChosenParts>, StoreError> {
        let v = &k.verdict;
        if let Some(p) = self.pool.chosen_lock().get(&v.verification_id) {
            return Ok(p.clone());
        }
        let stale = crate::stale::Staleness::new(store)
            .of_parts(v.arch, &v.suite_version, &v.driver_version)
            .await?;
        let kernel = store
            .kernel_by_digest(&k.digest)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("kernel {} is gone", k.label)))?;
        let verdict = store
            .verdict_parts(&[v.verification_id], q.dtype)
            .await?
            .remove(&v.verification_id)
            .and_then(|p| p.verdict)
            .ok_or_else(|| {
                StoreError::Corrupt(format!(
                    "verification {} passed a policy for {} without a verdict for it",
                    v.verification_id, q.dtype
                ))
            })?;
        let times = store
            .verification(v.verification_id)
            .await?
            .map(|row| Times::of(&row))
            .ok_or_else(|| {
                StoreError::NotFound(format!("verification {} is gone", v.verification_id))
            })?;
        let parts = Arc::new(ChosenParts {
            kernel,
            verdict,
            stale,
            times,
        });
        self.pool
            .chosen_lock()
            .insert(v.verification_id, parts.clone());
        Ok(parts)
    }

    // A panic while holding the lock leaves a map of complete entries: still good to read.

    fn texts_lock(&self) -> std::sync::MutexGuard<'_, HashMap<Shape, bytes::Bytes>> {
        self.texts.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The most lines `Resolution::also_qualifying` lists (fastest first);
/// `also_qualifying_total` counts them all.
pub const MAX_ALSO_QUALIFYING_LISTED: usize = 100;

/// The most lines `Resolution::excluded` lists (the answer stays bounded however many kernels
/// a group holds); `excluded_total` counts them all.
pub const MAX_EXCLUDED_LISTED: usize = 100;

/// The excluded lines of a resolve: the first `MAX_EXCLUDED_LISTED` kept (a failing verdict's
/// line is written once its verdict is read, for all of them in one query), all counted.
#[derive(Default)]
struct Excluded {
    lines: Vec<Line>,
    total: usize,
}

enum Line {
    Ready(String),
    /// `label`: why verification `id`'s verdict fails the policy.
    WhyNot(String, i64),
}

impl Excluded {
    fn wants_line(&self) -> bool {
        self.lines.len() < MAX_EXCLUDED_LISTED
    }
    fn push(&mut self, line: impl FnOnce() -> String) {
        if self.wants_line() {
            self.lines.push(Line::Ready(line()));
        }
        self.total += 1;
    }
    fn push_why_not(&mut self, label: String, verification_id: i64) {
        if self.wants_line() {
            self.lines.push(Line::WhyNot(label, verification_id));
        }
        self.total += 1;
    }
    fn why_not_ids(&self) -> Vec<i64> {
        self.lines
            .iter()
            .filter_map(|l| match l {
                Line::WhyNot(_, id) => Some(*id),
                Line::Ready(_) => None,
            })
            .collect()
    }
    fn render(
        self,
        parts: &mut HashMap<i64, Arc<kernel_store::VerdictParts>>,
        q: &Query,
    ) -> Vec<String> {
        self.lines
            .into_iter()
            .map(|l| match l {
                Line::Ready(s) => s,
                Line::WhyNot(label, id) => {
                    let why = parts
                        .get(&id)
                        .map(|p| p.why_not(&q.policy, q.dtype))
                        .unwrap_or_default();
                    format!("{label}: {}", why.join("; "))
                }
            })
            .collect()
    }
}

/// `/v1/resolve`'s answer to a query some kernel qualifies for (`Ranking::answer_text`; keys
/// in the order the answer has always had them).
#[derive(Serialize)]
struct Answer<'a> {
    also_qualifying: &'a [String],
    also_qualifying_total: usize,
    class: &'a str,
    device: &'a str,
    device_sm_count: Option<u32>,
    device_threads_per_sm: Option<u32>,
    digest: &'a kernel_registry::Digest,
    excluded: &'a [String],
    excluded_total: usize,
    kernel: &'a KernelRow,
    policy: String,
    queue_full: &'a Option<String>,
    queued_jobs: &'a [QueuedJob],
    runtime: Runtime,
    source_url: &'a str,
    speed: Option<AnswerSpeed>,
    stale: &'a [String],
    summary: &'a kernel_registry::report::Verdict,
    verification_id: i64,
    verification_url: String,
    verified_at: &'a str,
    imported_at: &'a Option<String>,
}

fn candidate(
    kernel: KernelRow,
    v: &VerdictOn,
    summary: kernel_registry::report::Verdict,
    coverage: CoverageAt,
    speed: Option<SpeedAt>,
    stale: Vec<String>,
    times: Times,
) -> Candidate {
    Candidate {
        source_url: format!("/v1/sources/{}", kernel.digest),
        speed,
        coverage,
        class: summary.class.to_string(),
        summary,
        verification_id: v.verification_id,
        device: v.device_name.to_string(),
        device_sm_count: v.sm_count,
        device_threads_per_sm: v.threads_per_sm,
        verified_at: times.verified_at,
        imported_at: times.imported_at,
        stale,
        kernel,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernel_registry::report::tests_support::{case, report_of_cases};
    use kernel_registry::report::{nearest_speed, ULP_INFINITE};
    use kernel_registry::KernelBundle;
    use kernel_store::Holder;

    /// The explorer's resolution (`Resolver::explain`) over caches of its own.
    async fn resolve(s: &Store, q: &Query) -> Result<Resolution, StoreError> {
        let (answers, rankings, pools) = (
            AnswerCache::default(),
            GenerationCache::default(),
            PoolCache::default(),
        );
        let r = Resolver {
            store: s,
            answers: &answers,
            rankings: &rankings,
            pools: &pools,
            max_pending: 0,
        };
        r.explain(q).await
    }

    /// A backward query's device figures restrict rms_norm_backward (its dw follows eager's
    /// column sum, configured by them) and not silu_mul_backward (elementwise): its verdict
    /// from an H200 serves a GPU of other figures of the same arch.
    #[test]
    fn the_device_figures_restrict_only_a_verdict_that_depends_on_them() {
        let on = |sm: Option<u32>| VerdictOn {
            verification_id: 1,
            arch: Arch::new(9, 0),
            device_name: "NVIDIA H200".into(),
            sm_count: sm,
            threads_per_sm: sm.map(|_| 2048),
            created_at: "".into(),
            class: "bit_exact".into(),
            suite_version: "".into(),
            driver_version: "".into(),
            passes: true,
            certifying_keys: 0,
            requested_cols: Arc::from(Vec::new()),
        };
        let q = |op: Op, device| Query {
            op,
            semantics: op.default_semantics(),
            dtype: DType::Bf16,
            arch: Arch::new(9, 0),
            cols: 4096,
            rows: None,
            policy: "bit_exact".parse().unwrap(),
            include_python: false,
            device,
        };
        let h100_pcie = Some((114, 2048));
        let why = other_device(&q(Op::RmsNormBackward, h100_pcie), &on(Some(132))).unwrap();
        assert!(
            why.contains("verified on a GPU of 132 SMs x 2048 threads per SM"),
            "{why}"
        );
        assert!(other_device(&q(Op::RmsNormBackward, Some((132, 2048))), &on(Some(132))).is_none());
        assert!(other_device(&q(Op::RmsNormBackward, h100_pcie), &on(None)).is_some());
        for v in [on(Some(132)), on(None)] {
            assert!(other_device(&q(Op::SiluMulBackward, h100_pcie), &v).is_none());
            assert!(other_device(&q(Op::SiluMulBackward, None), &v).is_none());
        }
    }

    #[test]
    fn a_field_appended_to_an_object_reads_back() {
        let text = serde_json::to_vec(&serde_json::json!({"a": 1, "b": [2]})).unwrap();
        let out = super::with_field(&text, "c", &serde_json::json!({"d": "e\"}"}));
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v, serde_json::json!({"a": 1, "b": [2], "c": {"d": "e\"}"}}));
    }

    const SM90: Arch = Arch { major: 9, minor: 0 };

    /// Kernel `i`'s report: bf16 at cols 1024 and 4096, rows 1, 64 (not every fifth kernel)
    /// and 4096, with speeds that rank the kernels differently at each row count, and a class
    /// that cycles through bit-exact, 1 ulp, 3 ulp and failing.
    fn report_of(k: &KernelBundle, i: usize) -> kernel_registry::VerificationReport {
        let (mism, ulp) = [(0, 0), (10, 1), (100, 3), (500, ULP_INFINITE)][i % 4];
        let mut cases = vec![];
        for cols in [1024u64, 4096] {
            for (r, rows) in [1u64, 64, 4096].into_iter().enumerate() {
                if i.is_multiple_of(5) && rows == 64 {
                    continue; // another layout of cases
                }
                let mut c = case(
                    &format!("bf16/{rows}x{cols}/normal"),
                    DType::Bf16,
                    mism,
                    ulp,
                );
                c.rows = rows;
                c.cols = cols;
                if let Some(s) = c.speed.as_mut() {
                    // Kernel i is fastest at row count r when i % 3 == r, with ties elsewhere.
                    s.gbps = 1000.0 + 500.0 * ((i + 3 - r) % 3) as f64 + (i / 12) as f64;
                }
                cases.push(c);
            }
        }
        report_of_cases(k, SM90, cases)
    }

    /// `n` copies of the bundled rms_norm (llama) kernel, each but the last verified on sm_90.
    async fn seed(s: &Store, n: usize) {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels/rms_norm_llama");
        let t = KernelBundle::load_dir(&dir).unwrap();
        for i in 0..n {
            let name = &t.manifest.name;
            let toml = t.manifest_toml.replacen(
                &format!("name = \"{name}\""),
                &format!("name = \"{name}_{i:03}\""),
                1,
            );
            let k =
                KernelBundle::from_parts(&toml, &format!("{}\n// copy {i}\n", t.source)).unwrap();
            s.insert_kernel(&k, "submitted", "test").await.unwrap();
            if i + 1 == n {
                continue;
            }
            let job = s
                .claim_job_on("test", None, 600_000, Some(SM90))
                .await
                .unwrap()
                .expect("the kernel's job");
            let lease = job.lease_id.clone().unwrap();
            let holder = Holder {
                lease_id: &lease,
                token_id: None,
                actor: "test",
            };
            s.complete_job(job.id, &holder, &report_of(&k, i))
                .await
                .unwrap();
        }
    }

    /// The fast path's twin: an answer derived from a ranking made for one `rows` (or none)
    /// is the answer resolving the query afresh gives, whatever the `rows`.
    async fn kept_rankings_answer_as_a_fresh_resolve(s: &Store) {
        seed(s, 30).await;
        let mut chosen = std::collections::BTreeSet::new();
        // One pool per width serves every policy and rows below.
        let pools = PoolCache::default();
        for policy in ["bit_exact", "ulp:1", "tolerance", "ulp:0,batch_invariant"] {
            for cols in [1024u64, 4096] {
                let q = |rows: Option<u64>| Query {
                    op: Op::RmsNorm,
                    semantics: Semantics::Llama,
                    dtype: DType::Bf16,
                    arch: SM90,
                    cols,
                    rows,
                    policy: policy.parse().unwrap(),
                    include_python: false,
                    device: None,
                };
                for made_for in [None, Some(1), Some(4096)] {
                    let kept = ranking(s, &q(made_for), None, None).await.unwrap();
                    assert!(kept.keepable());
                    for rows in [
                        None,
                        Some(1),
                        Some(2),
                        Some(8),
                        Some(64),
                        Some(500),
                        Some(4096),
                        Some(1 << 30),
                    ] {
                        // Each kernel's case is the one `nearest_speed` picks from its speeds.
                        let shape = kept.shape(&q(rows));
                        for k in kept.qualifying() {
                            let speeds = k.cases.iter().cloned();
                            assert_eq!(
                                Ranking::case_of(k, &shape).cloned(),
                                nearest_speed(speeds, rows, cols),
                                "{} rows {rows:?}",
                                k.label
                            );
                        }
                        let fresh = resolve(s, &q(rows)).await.unwrap();
                        let pooled = ranking(s, &q(rows), None, Some(&pools)).await;
                        assert_eq!(
                            answer(pooled, s, &q(rows)).await,
                            serde_json::to_value(&fresh).unwrap(),
                            "{policy} cols {cols} rows {rows:?}: a kept pool"
                        );
                        // The index's answer is the one `Policy::evaluate` on the full
                        // reports gives.
                        let slow = ranking_by_reports(s, &q(rows)).await;
                        assert_eq!(
                            answer(slow, s, &q(rows)).await,
                            serde_json::to_value(&fresh).unwrap(),
                            "{policy} cols {cols} rows {rows:?}: index and reports"
                        );
                        let derived = kept.resolution(s, &q(rows)).await.unwrap();
                        let coverage = kept.chosen_coverage(&shape, &q(rows)).unwrap();
                        assert_eq!(
                            serde_json::to_value(&coverage).unwrap(),
                            serde_json::to_value(fresh.chosen.as_ref().map(|c| &c.coverage))
                                .unwrap()
                        );
                        let (fresh, derived) = (
                            serde_json::to_value(&fresh).unwrap(),
                            serde_json::to_value(&derived).unwrap(),
                        );
                        assert_eq!(
                            derived, fresh,
                            "{policy} cols {cols} rows {rows:?} from {made_for:?}"
                        );
                        chosen.insert(fresh["chosen"]["kernel"]["name"].to_string());
                    }
                }
            }
        }
        assert!(
            chosen.len() >= 3,
            "the rows must change the choice: {chosen:?}"
        );
    }

    /// A ranking whose policy check is `Policy::evaluate` on each candidate's full report (read
    /// from the store): the slow, obviously-right decision the index's is compared with.
    async fn ranking_by_reports(s: &Store, q: &Query) -> Result<Ranking, StoreError> {
        let index = s.verdict_index(s.answer_generation().await?).await?;
        let mut inputs = vec![];
        for (i, _) in index.policy_free_inputs(q.op, q.semantics, q.arch, q.dtype) {
            let passes = match &i.candidate.on {
                Some(v) => {
                    let row = s.verification(v.verification_id).await?.unwrap();
                    q.policy.evaluate(&row.report, q.dtype).is_ok()
                }
                None => false,
            };
            inputs.push((i, Passes::Read(passes)));
        }
        rank(Arc::new(Pool::new(inputs, q)), index, s, q, None).await
    }

    /// The answer from the verdict index and from `Policy::evaluate` on the full reports, as
    /// JSON. The index's answer is made from `POOLS`, kept across every call of a test (so a
    /// pool made for one policy ranks the next ones, until a write moves the generation), and
    /// is compared with a fresh pool's and a pool made for the policy alone (`ranking_from`).
    async fn both(s: &Store, q: &Query) -> (serde_json::Value, serde_json::Value) {
        let slow = answer(ranking_by_reports(s, q).await, s, q).await;
        let pools = POOLS.with(|p| p.clone());
        let kept = answer(ranking(s, q, None, Some(&pools)).await, s, q).await;
        let index = serde_json::to_value(resolve(s, q).await.unwrap()).unwrap();
        assert_eq!(kept, index, "a kept pool");
        let generation = s.answer_generation().await.unwrap();
        let ix = s.verdict_index(generation).await.unwrap();
        let one = answer(ranking_from(ix, s, q, None).await, s, q).await;
        assert_eq!(one, index, "a pool for the one policy");
        (index, slow)
    }

    /// The answer to `q` from a ranking made for it, as JSON.
    async fn answer(r: Result<Ranking, StoreError>, s: &Store, q: &Query) -> serde_json::Value {
        serde_json::to_value(r.unwrap().resolution(s, q).await.unwrap()).unwrap()
    }

    thread_local! {
        static POOLS: Arc<PoolCache> = Arc::new(PoolCache::default());
    }

    /// Every write is in the next answer from the index (which follows the store a write at a
    /// time): a new verification, a new kernel, a verification certified by a worker key (for
    /// `confirmed:N`); and the answer is the one `Policy::evaluate` on the full reports gives
    /// after each.
    async fn the_index_follows_every_write(s: &Store) {
        seed(s, 12).await; // the last kernel is stored, not verified
        let q = |policy: &str| Query {
            op: Op::RmsNorm,
            semantics: Semantics::Llama,
            dtype: DType::Bf16,
            arch: SM90,
            cols: 4096,
            rows: Some(64),
            policy: policy.parse().unwrap(),
            include_python: false,
            device: None,
        };
        let policies = ["bit_exact", "ulp:3", "tolerance", "bit_exact,confirmed:1"];
        let mut before = vec![];
        for p in policies {
            let (index, slow) = both(s, &q(p)).await;
            assert_eq!(index, slow, "{p}");
            before.push(index);
        }
        let lines = |a: &serde_json::Value| a["excluded"].to_string();
        assert!(
            lines(&before[0]).contains("rms_norm_llama_011"),
            "{}",
            before[0]
        );
        assert!(
            lines(&before[0]).contains("never verified"),
            "{}",
            before[0]
        );

        // A new verification of the unverified kernel (bit-exact and the fastest).
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels/rms_norm_llama");
        let t = KernelBundle::load_dir(&dir).unwrap();
        let copy = |i: usize, name: &str| {
            let toml = t.manifest_toml.replacen(
                &format!("name = \"{}\"", t.manifest.name),
                &format!("name = \"{name}\""),
                1,
            );
            KernelBundle::from_parts(&toml, &format!("{}\n// copy {i}\n", t.source)).unwrap()
        };
        let k11 = copy(11, "rms_norm_llama_011");
        let mut r = report_of(&k11, 12 * 100); // bit-exact, the fastest at every row count
        for c in r.cases.iter_mut() {
            if let Some(sp) = c.speed.as_mut() {
                sp.gbps = 9000.0;
            }
        }
        s.seed_verification(&k11.digest(), &r, None).await.unwrap();
        let (index, slow) = both(s, &q("bit_exact")).await;
        assert_eq!(index, slow);
        assert_eq!(
            index["chosen"]["kernel"]["name"], "rms_norm_llama_011",
            "{index}"
        );
        assert!(!lines(&index).contains("never verified"), "{index}");

        // A new kernel, never verified: one more excluded line, in list order (its name sorts
        // first).
        let first = copy(99, "a_rms_norm_first");
        s.insert_kernel(&first, "submitted", "test").await.unwrap();
        for p in policies {
            let (index, slow) = both(s, &q(p)).await;
            assert_eq!(index, slow, "{p}");
            let first = index["excluded"][0].as_str().unwrap();
            assert!(
                first.starts_with("a_rms_norm_first ") && first.contains(": never verified"),
                "{index}"
            );
        }

        // confirmed:1: nothing is certified yet; a verification certified by a worker key
        // makes its kernel qualify.
        let (index, _) = both(s, &q("bit_exact,confirmed:1")).await;
        assert!(index["chosen"].is_null(), "{index}");
        let cert = kernel_registry::cert::Certificate {
            claims: "{}".into(),
            key: "worker-key-1".into(),
            signature: "sig".into(),
        };
        let k4 = copy(4, "rms_norm_llama_004");
        s.seed_verification(&k4.digest(), &report_of(&k4, 4), Some(&cert))
            .await
            .unwrap();
        let (index, slow) = both(s, &q("bit_exact,confirmed:1")).await;
        assert_eq!(index, slow);
        assert_eq!(
            index["chosen"]["kernel"]["name"], "rms_norm_llama_004",
            "{index}"
        );
        for p in policies {
            let (index, slow) = both(s, &q(p)).await;
            assert_eq!(index, slow, "{p}");
        }
    }

    #[tokio::test]
    async fn the_index_follows_every_write_sqlite() {
        let db = kernel_store::testing::fresh_sqlite();
        let s = Store::open(&db.url).await.unwrap();
        the_index_follows_every_write(&s).await;
    }

    #[tokio::test]
    async fn the_index_follows_every_write_postgres() {
        let Some(url) = kernel_store::testing::fresh_postgres_url("resolve index").await else {
            return;
        };
        let s = Store::open(&url).await.unwrap();
        the_index_follows_every_write(&s).await;
    }

    #[tokio::test]
    async fn kept_rankings_answer_as_a_fresh_resolve_sqlite() {
        let db = kernel_store::testing::fresh_sqlite();
        let s = Store::open(&db.url).await.unwrap();
        kept_rankings_answer_as_a_fresh_resolve(&s).await;
    }

    #[tokio::test]
    async fn kept_rankings_answer_as_a_fresh_resolve_postgres() {
        let Some(url) = kernel_store::testing::fresh_postgres_url("resolve rankings").await else {
            return;
        };
        let s = Store::open(&url).await.unwrap();
        kept_rankings_answer_as_a_fresh_resolve(&s).await;
    }
}
