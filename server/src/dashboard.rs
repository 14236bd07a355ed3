//! The verification dashboard: server-rendered HTML (maud, which escapes every interpolated
//! value) with plots as SVG drawn on the server, so it needs no network and no JavaScript.

mod field;
mod kernel;
mod overview;
pub mod overview_data;
mod plot;
mod policy;

use crate::error::AppError;
use crate::state::AppState;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use kernel_registry::report::{percent, ExactnessClass, ULP_INFINITE};
use maud::{html, Markup, PreEscaped, DOCTYPE};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(overview::page))
        .route("/kernels/{name}/{version}", get(kernel::page))
        .route("/field", get(field::page))
        .route("/policy", get(policy::page))
}

/// An error shown as an HTML page with the API's status and detail (pages are read by people).
pub struct PageError(AppError);

impl From<AppError> for PageError {
    fn from(e: AppError) -> Self {
        PageError(e)
    }
}

impl From<kernel_store::StoreError> for PageError {
    fn from(e: kernel_store::StoreError) -> Self {
        PageError(e.into())
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let status = self.0.status;
        // 5xx details were logged by AppError; show its generic text.
        let title = status.canonical_reason().unwrap_or("Error");
        let body = layout(
            title,
            Nav::None,
            html! {
                h1 { (status.as_u16()) " " (title) }
                p.error { (self.0.detail) }
                p { a href="/" { "Back to the overview" } }
            },
        );
        (status, body).into_response()
    }
}

/// Which tab of the navigation is current.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Nav {
    Overview,
    Field,
    Kernel,
    Policy,
    None,
}

const CSS: &str = r#"
:root{--fg:#1b1f24;--muted:#5b6570;--line:#d8dde3;--bg:#fff;--head:#f3f5f7;--ok:#1a7f37;--ulp:#9a6700;--tol:#bc4c00;--bad:#cf222e;--acc:#0a58ca}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:var(--fg);background:var(--bg);margin:0}
header{background:#14181d;color:#fff;padding:10px 24px;display:flex;gap:24px;align-items:baseline}
header .brand{font-weight:700;font-size:17px;color:#fff;text-decoration:none}
header nav a{color:#c9d1d9;text-decoration:none;margin-right:16px}
header nav a.current{color:#fff;border-bottom:2px solid #58a6ff}
main{padding:16px 24px;max-width:1600px}
h1{font-size:22px;margin:8px 0 4px}h2{font-size:18px;margin:24px 0 8px}h3{font-size:15px;margin:16px 0 6px}
p.lead{color:var(--muted);margin:0 0 12px}
a{color:var(--acc)}
table{border-collapse:collapse;margin:6px 0 12px}
th,td{border-bottom:1px solid var(--line);padding:3px 8px;text-align:left;vertical-align:top}
th{background:var(--head);position:sticky;top:0;font-weight:600;z-index:1}
td.wrap{min-width:260px}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
td.num,.badge,time,.bar{white-space:nowrap}
td a,td strong,td code,ul.why li{overflow-wrap:anywhere}
td.why{min-width:280px}
#matrix td:first-child,#unverified td:first-child,#resolutions td.chosen{min-width:12em}#field td:first-child{min-width:8em}
table.cases th,table.cases td,#field th,#field td{padding:3px 5px}table.cases td.num{white-space:normal}
tr.group td{background:#e9eef4;font-weight:600}
.scroll{overflow:auto;max-height:75vh;border:1px solid var(--line)}
.scroll table{margin:0}
.badge{display:inline-block;padding:0 7px;border-radius:10px;font-size:12px;font-weight:600;color:#fff}
.c-bit_exact{background:var(--ok)}.c-ulp{background:var(--ulp)}.c-tolerance{background:var(--tol)}.c-fails{background:var(--bad)}.c-none{background:#8c959f}
.bar{display:inline-block;width:60px;height:8px;background:#e6e9ed;margin-left:6px;vertical-align:middle}
.bar i{display:block;height:8px;background:#3b82f6}
form.filters{display:flex;gap:12px;align-items:end;flex-wrap:wrap;margin:8px 0 12px}
form.filters label{display:flex;flex-direction:column;font-size:12px;color:var(--muted)}
select,input{font:inherit;padding:3px 6px}
button{font:inherit;padding:4px 14px}
.note{background:#fff8c5;border:1px solid #d4a72c;padding:10px 14px;border-radius:6px;max-width:900px}
.error{background:#ffebe9;border:1px solid #ff8182;padding:10px 14px;border-radius:6px;max-width:900px}
pre{background:#f6f8fa;border:1px solid var(--line);padding:10px;overflow:auto;max-height:480px;font-size:12px}
code{font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:12px}
.plots{display:flex;flex-wrap:wrap;gap:16px}
.plots figure{margin:0;border:1px solid var(--line);padding:6px}
.plots figcaption{font-size:12px;color:var(--muted);max-width:420px}
dl.meta{display:grid;grid-template-columns:max-content auto;gap:2px 14px;margin:6px 0}
dl.meta dt{color:var(--muted)}dl.meta dd{margin:0}
ul.why{margin:4px 0;padding-left:18px}
.muted{color:var(--muted)}
.imported{color:var(--muted);font-size:12px;white-space:nowrap}.nw{white-space:nowrap}
#field td.verified time,#field td.verified .imported{white-space:normal}
section.verification{border-top:2px solid var(--line);margin-top:18px}
"#;

fn layout(title: &str, nav: Nav, body: Markup) -> Markup {
    let tab = |n: Nav| if n == nav { "current" } else { "" };
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                // An empty icon: the browser asks for no /favicon.ico.
                link rel="icon" href="data:,";
                title { (title) " · kernelize" }
                style { (PreEscaped(CSS)) }
            }
            body {
                header {
                    a.brand href="/" { "kernelize" }
                    nav {
                        a class=(tab(Nav::Overview)) href="/" { "Verification matrix" }
                        a class=(tab(Nav::Field)) href="/field" { "The field" }
                        @if nav == Nav::Kernel { a.current { "Kernel" } }
                        a class=(tab(Nav::Policy)) href="/policy" { "Policy explorer" }
                        a href="/openapi.json" { "API" }
                    }
                }
                main { (body) }
            }
        }
    }
}

/// The exactness class as a coloured badge, in words a person reads.
fn class_badge(class: ExactnessClass) -> Markup {
    let (css, text) = match class {
        ExactnessClass::BitExact => ("c-bit_exact", "bit-exact".to_string()),
        ExactnessClass::MaxUlp(n) => ("c-ulp", format!("max {} ulp", ulp(n))),
        ExactnessClass::Tolerance => ("c-tolerance", "tolerance".to_string()),
        ExactnessClass::Fails => ("c-fails", "fails".to_string()),
    };
    html! { span class={"badge " (css)} title=(class.to_string()) { (text) } }
}

fn ulp(n: u64) -> String {
    if n == ULP_INFINITE {
        "∞".into()
    } else {
        n.to_string()
    }
}

fn frac(x: f64) -> String {
    percent(x)
}

fn sci(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else if x.is_nan() {
        "NaN".into()
    } else {
        format!("{x:.2e}")
    }
}

fn gbps(x: f64) -> String {
    format!("{x:.0}")
}

/// An RFC 3339 timestamp as `YYYY-MM-DD HH:MM` (UTC), the full text kept in a tooltip.
fn date(ts: &str) -> Markup {
    html! { time datetime=(ts) title=(ts) { (short_time(ts)) } }
}

/// An RFC 3339 time to the minute (`2026-11-27 07:18`); other text as it is.
fn short_time(ts: &str) -> String {
    if ts.len() >= 16 && ts.as_bytes().get(10) == Some(&b'T') {
        format!("{} {}", &ts[..10], &ts[11..16])
    } else {
        ts.to_string()
    }
}

/// A verdict's "verified" cell: when the GPU measured it (its report's `started_at`, the API's
/// `verified_at`), not when this hub stored it. An imported certificate (`imported_at`) says
/// both times in its title, and the day it was imported on a second line when that is another
/// day than the measurement's. A day is never broken at its hyphens (the field's narrow column
/// may break between the day and the hour).
fn verified(verified_at: &str, imported_at: Option<&str>) -> Markup {
    let day = |t: &str| t.get(..10).unwrap_or(t).to_string();
    let title = match imported_at {
        Some(imported) => {
            format!("measured by the GPU {verified_at}; imported by this hub {imported}")
        }
        None => format!("measured by the GPU {verified_at}"),
    };
    let short = short_time(verified_at);
    let (d, hour) = short.split_once(' ').unwrap_or((short.as_str(), ""));
    html! {
        time datetime=(verified_at) title=(title) {
            span.nw { (d) }
            @if !hour.is_empty() { " " (hour) }
        }
        @if let Some(imported) = imported_at.filter(|i| day(i) != day(verified_at)) {
            br;
            span.imported title=(title) { "imported " span.nw { (day(imported)) } }
        }
    }
}

/// The fraction of the copy-bandwidth roofline as a number and a small bar.
fn roofline(fraction: f64) -> Markup {
    let width = (fraction.clamp(0.0, 1.0) * 100.0).round();
    html! {
        (format!("{:.0}%", fraction * 100.0))
        span.bar title="fraction of this device's measured copy bandwidth" { i style={"width:" (width) "%"} {} }
    }
}

/// A dashboard page's address with the filters that are set (`op`, `dtype`, `arch`), then the
/// paging parameters that differ from their defaults (`(name, value, default)`).
fn filter_href(
    path: &str,
    op: Option<kernel_registry::Op>,
    dtype: Option<kernel_registry::DType>,
    arch: Option<kernel_registry::Arch>,
    paging: &[(&str, i64, i64)],
) -> String {
    let mut parts = vec![];
    if let Some(o) = op {
        parts.push(format!("op={o}"));
    }
    if let Some(d) = dtype {
        parts.push(format!("dtype={d}"));
    }
    if let Some(a) = arch {
        parts.push(format!("arch={a}"));
    }
    for (name, value, default) in paging {
        if value != default {
            parts.push(format!("{name}={value}"));
        }
    }
    if parts.is_empty() {
        path.into()
    } else {
        format!("{path}?{}", parts.join("&"))
    }
}

fn kernel_href(name: &str, version: &str) -> String {
    // Names and versions are restricted to URL-safe characters by the manifest parser.
    format!("/kernels/{name}/{version}")
}

/// Parse an optional query parameter with the domain's parser: the API's own function
/// (`api::param`), so a page refuses what the API refuses, with the same message (a 400 page).
/// A repeated parameter is refused by the edge for pages as for the API.
fn opt_param<T: std::str::FromStr>(
    q: &std::collections::HashMap<String, String>,
    key: &str,
) -> Result<Option<T>, AppError>
where
    T::Err: std::fmt::Display,
{
    crate::api::param(q, key)
}

/// Refuse a query parameter the page does not take (the API's `known_params`): a typo would
/// otherwise silently show the unfiltered page.
fn known_params(
    q: &std::collections::HashMap<String, String>,
    allowed: &[&str],
) -> Result<(), AppError> {
    crate::api::known_params(q, allowed)
}
