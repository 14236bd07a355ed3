//! The OpenAPI document: paths come from the route list (`routes::api_routes`, each handler's
//! `#[utoipa::path]`), parameter rules from the domain's own lists, and the refusals the edge
//! makes on every route are declared here once.

use crate::error::Problem;
use kernel_registry::{DType, Op, Semantics};
use std::borrow::Cow;
use utoipa::openapi::path::Operation;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{Content, Ref, RefOr, Response};
use utoipa::{Modify, OpenApi, PartialSchema, ToSchema};

struct TokenAuth;
impl Modify for TokenAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "token",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The document's frame; `routes::api_routes` adds every path to it.
#[derive(OpenApi)]
#[openapi(
    info(title = "kernelize", description = "A kernel hub that hands out only verified layer replacements.\n\nEvery refusal is `application/problem+json` (RFC 9457) whose `detail` says what was wrong and how to fix it, and whose `field` names the parameter or field at fault. Text in a path or query parameter is one line (no control characters); a query parameter is either left out or given a value without surrounding spaces; no string of a body may hold NUL. Writes are limited per token (429 with `Retry-After`). An unknown, expired or revoked token gets 401 with `reason`. Every answer carries `x-request-id`."),
    components(schemas(Problem, ResolveAnswer, ResolveSpeed, MeasuredShape, VerificationRecord, KernelVerifications, OpName, SemanticsName, DTypeName, ArchName, PolicyText, DigestText, KernelName, KernelVersion)),
    modifiers(&TokenAuth)
)]
pub struct ApiDoc;

/// A string parameter's schema with the allowed values or a pattern.
fn string_schema(
    description: &str,
    values: Option<Vec<&'static str>>,
    pattern: Option<&str>,
) -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .description(Some(description))
        .enum_values(values)
        .pattern(pattern)
        .into()
}

/// Declares a parameter schema named like the domain type whose parser enforces it.
macro_rules! param_schema {
    ($ty:ident, $name:literal, $schema:expr) => {
        pub struct $ty;
        impl PartialSchema for $ty {
            fn schema() -> RefOr<Schema> {
                $schema
            }
        }
        impl ToSchema for $ty {
            fn name() -> Cow<'static, str> {
                Cow::Borrowed($name)
            }
        }
    };
}

param_schema!(
    OpName,
    "Op",
    string_schema(
        "The layer operation.",
        Some(Op::ALL.iter().map(|o| o.as_str()).collect()),
        None
    )
);
param_schema!(
    SemanticsName,
    "Semantics",
    string_schema(
        "The reference semantics (llama, gemma or torch for rms_norm; `default` for the other ops).",
        Some(Semantics::ALL.iter().map(|s| s.as_str()).collect()),
        None
    )
);
param_schema!(
    DTypeName,
    "DType",
    string_schema(
        "The element type.",
        Some(DType::ALL.iter().map(|d| d.as_str()).collect()),
        None
    )
);
param_schema!(
    ArchName,
    "Arch",
    string_schema(
        "A CUDA compute capability `sm_<major><minor>`, major 3..20, one-digit minor (e.g. sm_80, sm_90, sm_100).",
        None,
        Some(ARCH_PATTERN)
    )
);
param_schema!(
    PolicyText,
    "Policy",
    string_schema(
        "An exactness policy: bit_exact, ulp:N, tolerance or argmax, then any of ,deterministic ,batch_invariant ,max_abs_diff=X ,max_mismatch_fraction=X (X a non-negative number; a fraction at most 1) ,confirmed:N (N from 1 to 100 worker keys certifying the class) ,audited (the compiled code's capability audit is required) ,allow:clock ,allow:environment ,allow:state (hand out a kernel whose audit finds that gated capability, declared by its manifest; docs/spec.md section 3b).",
        None,
        Some(POLICY_PATTERN)
    )
);
param_schema!(
    DigestText,
    "Digest",
    string_schema(
        "A content digest: sha256:<64 lowercase hex digits>, or the 64 hex digits alone.",
        None,
        Some(DIGEST_PATTERN)
    )
);
param_schema!(
    KernelName,
    "KernelName",
    string_schema(
        "A kernel's name: 1-64 characters of a-z, 0-9 and _ (and - or . after the first).",
        None,
        Some(NAME_PATTERN)
    )
);
param_schema!(
    KernelVersion,
    "KernelVersion",
    string_schema(
        "A kernel's semantic version, e.g. 1.0.0.",
        None,
        Some(VERSION_PATTERN)
    )
);

/// `GET /v1/resolve`'s answer when a kernel qualifies (the 200 body). Every field is always
/// present; a client may ignore the ones it does not know.
#[derive(ToSchema)]
#[allow(dead_code)] // documentation: the answer is written by `crate::resolve::Ranking::answer_text`
pub struct ResolveAnswer {
    /// The chosen kernel's stored row (name, version, op, semantics, digest, runtime, ...).
    #[schema(value_type = Object)]
    kernel: (),
    /// Its content digest.
    digest: String,
    /// `cuda` or `python`.
    runtime: String,
    /// Its exactness class at the asked dtype on the asked arch, e.g. `bit_exact`, `ulp:1`.
    class: String,
    /// The verdict at the asked dtype.
    #[schema(value_type = Object)]
    summary: (),
    /// The policy applied.
    policy: String,
    /// The semantics resolved: the asked one, or the op's default when `semantics` was left out.
    #[schema(value_type = SemanticsName)]
    semantics: String,
    /// true when `semantics` was left out and `semantics` is the op's default (rms_norm:
    /// `llama`, one of llama, gemma, torch).
    semantics_defaulted: bool,
    /// The GPU the verification ran on.
    device: String,
    /// Its SM count (null: the report does not say). A rms_norm_backward kernel's verdict holds
    /// for this and `device_threads_per_sm` (eager's dw order depends on both).
    device_sm_count: Option<u32>,
    /// Its maximum threads per SM (null: the report does not say).
    device_threads_per_sm: Option<u32>,
    verification_id: i64,
    verification_url: String,
    /// When the GPU measured it: the verification report's own `started_at` (RFC 3339), not
    /// when this hub stored or imported it.
    verified_at: String,
    /// When this hub imported the verification (a certificate measured elsewhere, e.g. the
    /// bundled ones; RFC 3339); null when this hub's own worker measured it.
    imported_at: Option<String>,
    /// The chosen kernel's timed case nearest the asked shape, labelled with the shape it was
    /// measured at; null when no case was timed.
    speed: Option<ResolveSpeed>,
    /// What the verification covered at the asked width.
    #[schema(value_type = Object)]
    coverage: (),
    source_url: String,
    /// Why the verdict is stale (empty: it is not).
    stale: Vec<String>,
    /// The first 100 other qualifying kernels, fastest first.
    also_qualifying: Vec<String>,
    also_qualifying_total: u64,
    /// Why each kernel not chosen is out (the first 100).
    excluded: Vec<String>,
    excluded_total: u64,
    /// Always empty: a GET queues nothing.
    #[schema(value_type = Vec<Object>)]
    queued_jobs: (),
    /// Always null on a GET.
    queue_full: Option<String>,
}

/// A resolve answer's speed: one timed case of the verification, the one nearest the asked
/// rows x cols (the suite times a few shapes, e.g. 4096x8192 and 32768x4096 for row-wise ops),
/// so it may be another shape than the one asked: `measured_at` and `asked_width_measured` say.
#[derive(ToSchema)]
#[allow(dead_code)] // documentation: written by `crate::resolve::AnswerSpeed`
pub struct ResolveSpeed {
    /// The rows of the timed case (as `measured_at.rows`).
    rows: u64,
    /// The cols of the timed case (as `measured_at.cols`).
    cols: u64,
    /// Effective bandwidth, GB/s.
    gbps: Option<f64>,
    median_us: Option<f64>,
    /// Its fraction of the device's copy bandwidth.
    copy_fraction: Option<f64>,
    /// Reference time over candidate time.
    speedup: Option<f64>,
    /// The shape the figure was measured at.
    measured_at: MeasuredShape,
    /// true when it was measured at the asked width (row-wise ops: a case of exactly the asked
    /// `cols`; elementwise ops: a case of exactly the asked element count, rows x cols); false:
    /// no speed was measured at the asked width and this is the nearest timed shape's.
    asked_width_measured: bool,
    /// Row-wise ops with `rows` asked: whether the case ran exactly that many rows (absent
    /// otherwise).
    asked_rows_measured: Option<bool>,
    /// Present when `asked_width_measured` is false: which shape the figure is.
    note: Option<String>,
}

/// A verification record: `GET /v1/verifications/{id}`, and each of a kernel's in
/// `GET /v1/kernels/{name}/{version}/verifications`. Its times are named as in a resolve answer:
/// `verified_at` when the GPU measured it, `imported_at` when this hub imported it, `created_at`
/// when this hub stored it.
#[derive(ToSchema)]
#[allow(dead_code)] // documentation: `kernel_store::VerificationRow` with `stale` (`crate::stale::Staleness::json`)
pub struct VerificationRecord {
    id: i64,
    /// The verified kernel's content digest.
    kernel_digest: String,
    /// The job of this hub whose worker measured it; null when it was imported (a certificate
    /// measured elsewhere, e.g. a bundled one).
    #[schema(required = true)]
    job_id: Option<i64>,
    /// The GPU architecture it ran on, e.g. `sm_90`.
    arch: String,
    /// The GPU it ran on.
    device_name: String,
    /// Its overall exactness class, e.g. `bit_exact`, `ulp:1`.
    exactness_class: String,
    /// When this hub stored it (RFC 3339).
    created_at: String,
    /// When the GPU measured it: the report's own `started_at` (RFC 3339), as a resolve
    /// answer's `verified_at`; not when this hub stored or imported it.
    verified_at: String,
    /// When this hub imported it (RFC 3339; the same as `created_at`); null when this hub's own
    /// worker measured it (`job_id` is set).
    #[schema(required = true)]
    imported_at: Option<String>,
    /// The full verification report.
    #[schema(value_type = Object)]
    report: (),
    /// The worker's signed certificate of the report; null when none was sent.
    #[schema(value_type = Option<Object>, required = true)]
    certificate: (),
    /// Why its verdict is stale (empty: it is not).
    stale: Vec<String>,
}

/// `GET /v1/kernels/{name}/{version}/verifications`: the kernel and every verification of it,
/// newest first.
#[derive(ToSchema)]
#[allow(dead_code)] // documentation: written by `crate::api::kernels::verifications`
pub struct KernelVerifications {
    /// The kernel's stored row (name, version, op, semantics, digest, runtime, ...).
    #[schema(value_type = Object)]
    kernel: (),
    verifications: Vec<VerificationRecord>,
}

/// A shape a speed was measured at.
#[derive(ToSchema)]
#[allow(dead_code)] // documentation: written by `crate::resolve::MeasuredAt`
pub struct MeasuredShape {
    rows: u64,
    cols: u64,
}

pub const ARCH_PATTERN: &str = r"^sm_([3-9]|1[0-9]|20)[0-9]$";
pub const DIGEST_PATTERN: &str = r"^(sha256:)?[0-9a-f]{64}$";
pub const NAME_PATTERN: &str = r"^[a-z0-9_][a-z0-9_.-]{0,63}$";
pub const VERSION_PATTERN: &str =
    r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$";
pub static POLICY_PATTERN: &str = concat!(
    r"^(bit_exact|tolerance|argmax|ulp:\+?[0-9]{1,19})",
    r"( *, *(deterministic|batch_invariant|max_abs_diff=",
    r"\+?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?",
    r"|max_mismatch_fraction=",
    r"\+?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?",
    r"|confirmed:\+?0*([1-9][0-9]?|100)",
    r"|audited|allow:(clock|environment|state)",
    r"))*$"
);

// Bounds the annotations state as literals (utoipa takes no constants there); the edge
// enforces what the document says, and `declared_bounds_are_these` keeps the two in step.
/// The most items a page of a list holds.
pub const MAX_PAGE: i64 = 500;
/// The largest `offset` a list accepts (far beyond any real list; keeps `offset + limit`
/// inside an i64).
pub const MAX_OFFSET: i64 = i32::MAX as i64;
/// The largest `cols` and `rows` resolve accepts (2^40: beyond any verifiable width).
pub const MAX_EXTENT: u64 = 1 << 40;

fn problem(description: &str) -> RefOr<Response> {
    let mut r = Response::new(description);
    r.content.insert(
        crate::error::PROBLEM_JSON.to_string(),
        Content::new(Some(Ref::from_schema_name("Problem"))),
    );
    RefOr::T(r)
}

/// Declare on every operation what the edge may answer besides the handler's own statuses,
/// and give every declared refusal the problem body.
pub fn declare_the_edge(doc: &mut utoipa::openapi::OpenApi) {
    for item in doc.paths.paths.values_mut() {
        let ops = [
            &mut item.get,
            &mut item.post,
            &mut item.put,
            &mut item.delete,
            &mut item.patch,
        ];
        for op in ops.into_iter().flatten() {
            declare_on(op);
        }
    }
    // The problem schema is referenced by every refusal.
    let components = doc.components.get_or_insert_with(Default::default);
    components
        .schemas
        .entry("Problem".into())
        .or_insert_with(Problem::schema);
}

fn declare_on(op: &mut Operation) {
    let writes = op.security.is_some();
    let body = op.request_body.is_some();
    let mut edge: Vec<(&str, &str)> = vec![
        ("400", "A parameter or the body breaks a rule of this document (a control character in a parameter, NUL in a body, an integer out of its bounds, an empty query parameter or one with surrounding spaces, an unknown parameter, bad JSON); `field` names it"),
        ("401", "A token is needed (writes, or every route with `--private-reads`), or the `Authorization` header is not a valid `Bearer` token, or the token is unknown, expired or revoked (`reason` says which)"),
        ("408", "The body did not arrive in time (`serve --body-timeout-s`)"),
        ("413", "The body is larger than 2 MiB"),
        ("500", "The server failed; the error is logged, not shown"),
    ];
    if writes {
        edge.push(("403", "The token lacks the scope this route needs"));
        edge.push((
            "429",
            "This token made too many writes; retry after `Retry-After` seconds",
        ));
    }
    if body {
        edge.push((
            "415",
            "The body is not `application/json` (submit: or `multipart/form-data`)",
        ));
        edge.push((
            "422",
            "The JSON is well-formed but does not fit this route's body (a missing field, a wrong type, an unknown field)",
        ));
    }
    for (status, description) in edge {
        op.responses
            .responses
            .entry(status.to_string())
            .or_insert_with(|| problem(description));
    }
    // Refusals declared by the handler get the problem body too.
    for (status, r) in op.responses.responses.iter_mut() {
        if !(status.starts_with('4') || status.starts_with('5')) {
            continue;
        }
        if let RefOr::T(r) = r {
            if r.content.is_empty() {
                r.content.insert(
                    crate::error::PROBLEM_JSON.to_string(),
                    Content::new(Some(Ref::from_schema_name("Problem"))),
                );
            }
        }
    }
    if let Some(RefOr::T(r)) = op.responses.responses.get_mut("429") {
        r.headers.insert(
            "Retry-After".to_string(),
            utoipa::openapi::header::HeaderBuilder::new()
                .schema(
                    ObjectBuilder::new()
                        .schema_type(Type::Integer)
                        .minimum(Some(1)),
                )
                .description(Some("Seconds to wait before the next write"))
                .build(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernel_registry::{Arch, Digest, Policy};
    use regex::Regex;

    /// The pattern and the parser accept the same strings (`accept` says which they should).
    fn agree<T: std::str::FromStr>(pattern: &str, cases: &[(&str, bool)]) {
        let re = Regex::new(pattern).unwrap();
        for (s, accept) in cases {
            assert_eq!(re.is_match(s), *accept, "pattern {pattern} on `{s}`");
            assert_eq!(s.parse::<T>().is_ok(), *accept, "parser on `{s}`");
        }
    }

    #[test]
    fn declared_patterns_are_what_the_parsers_accept() {
        agree::<Arch>(
            ARCH_PATTERN,
            &[
                ("sm_30", true),
                ("sm_90", true),
                ("sm_100", true),
                ("sm_209", true),
                ("sm_2", false),
                ("sm_210", false),
                ("sm_9", false),
                ("sm_90a", false),
                ("hopper", false),
                ("", false),
            ],
        );
        let hex = "0123456789abcdef".repeat(4);
        agree::<Digest>(
            DIGEST_PATTERN,
            &[
                (&hex, true),
                (&format!("sha256:{hex}"), true),
                (&format!("sha256:{}", hex.to_uppercase()), false),
                (&hex[1..], false),
                (&format!("sha512:{hex}"), false),
            ],
        );
        agree::<Policy>(
            POLICY_PATTERN,
            &[
                ("bit_exact", true),
                ("ulp:2,deterministic,batch_invariant", true),
                (
                    "tolerance,max_abs_diff=1e-3,max_mismatch_fraction=0.5",
                    true,
                ),
                ("argmax , deterministic", true),
                ("ulp:+3", true),
                ("tolerance,max_abs_diff=.5", true),
                ("bit_exact,confirmed:2", true),
                ("bit_exact,confirmed:100,deterministic", true),
                ("bit_exact,confirmed:007", true),
                ("bit_exact,audited", true),
                ("ulp:1,allow:clock,allow:state,allow:environment", true),
                ("bit_exact,allow:trap", false),
                ("bit_exact,allow:", false),
                ("bit_exact,allow:clocks", false),
                ("bit_exact,confirmed:0", false),
                ("bit_exact,confirmed:101", false),
                ("bit_exact,confirmed:", false),
                ("exact", false),
                ("ulp:x", false),
                ("ulp:", false),
                ("bit_exact,fast", false),
                ("tolerance,max_abs_diff=-1", false),
                ("tolerance,max_abs_diff=nan", false),
                ("", false),
            ],
        );
        // Every capability a policy may allow, and no other.
        let allow: Vec<String> = kernel_registry::capability::Capability::ALL
            .iter()
            .map(|c| format!("bit_exact,allow:{c}"))
            .collect();
        let cases: Vec<(&str, bool)> = allow
            .iter()
            .zip(kernel_registry::capability::Capability::ALL)
            .map(|(s, c)| (s.as_str(), c.gated()))
            .collect();
        agree::<Policy>(POLICY_PATTERN, &cases);
    }
}
