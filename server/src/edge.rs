//! The edge: what every request passes before its handler, and the shape of every refusal.
//!
//! - One text rule. A path or query parameter is one line of UTF-8 text (no control
//!   characters); a JSON body's strings and keys and a multipart part hold no NUL. PostgreSQL
//!   cannot store NUL while SQLite can: refusing it here keeps the backends answering alike.
//!   (Lone surrogates and invalid UTF-8 never become a `String`: JSON and percent-decoding
//!   refuse them here or in the handler's extractor, with a 400.)
//! - Integer parameters are held to the bounds the OpenAPI document declares for them, and a
//!   JSON body to its operation's request schema (types, required and unknown fields, lengths,
//!   patterns), so the document and the server cannot disagree: whatever breaks a rule the
//!   document states is refused here with a 422 naming the field, before any handler runs.
//! - A body is read whole, at most `max_body_bytes`, within `body_timeout` (413 / 408).
//! - Any refusal made below the handlers (an unknown route, a method not allowed, an
//!   extractor's rejection, a panic) leaves as `application/problem+json`.
//!
//! Pages of the dashboard (routes not in the OpenAPI document) are read by people: the edge's
//! refusals on them are HTML, like their own.

pub mod rate;

use crate::dashboard::PageError;
use crate::error::{quote, quote_at, AppError, PROBLEM_JSON};
use crate::state::Scope;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, MatchedPath, Multipart, RawPathParams, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::BytesMut;
use http_body_util::{BodyExt, Limited};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

/// What the edge knows about the routes, and its limits.
pub struct Edge {
    /// Integer parameters per (method, route), with their declared bounds.
    integers: HashMap<(Method, String), Vec<IntegerParam>>,
    /// The query parameters each (method, route) declares; any other is refused.
    queries: HashMap<(Method, String), Vec<String>>,
    /// Routes of the API (in the OpenAPI document); any other route is a page.
    api_routes: HashSet<String>,
    /// The JSON request body schema per (method, route), with its name for messages.
    bodies: HashMap<(Method, String), BodySchema>,
    /// The operations that need a token (the document's `security`), with the scopes that
    /// may call each (its requirement's scopes; admin holds every scope).
    secured: HashMap<(Method, String), Vec<Scope>>,
    pub max_body_bytes: usize,
    pub body_timeout: Duration,
}

struct BodySchema {
    /// The schema's name in the document's components (`ClaimRequest`).
    name: String,
    validator: jsonschema::Validator,
}

#[derive(Debug, Clone)]
struct IntegerParam {
    name: String,
    in_path: bool,
    min: i128,
    max: i128,
}

impl Edge {
    /// The edge of the API `doc` describes.
    pub fn new(
        doc: &utoipa::openapi::OpenApi,
        max_body_bytes: usize,
        body_timeout: Duration,
    ) -> Edge {
        let doc = serde_json::to_value(doc).expect("the OpenAPI document serialises");
        let mut integers = HashMap::new();
        let mut queries = HashMap::new();
        let mut api_routes = HashSet::new();
        let mut bodies = HashMap::new();
        let mut secured = HashMap::new();
        for (path, item) in doc["paths"].as_object().into_iter().flatten() {
            api_routes.insert(path.clone());
            for (method, op) in item.as_object().into_iter().flatten() {
                let Ok(method) = method.to_uppercase().parse::<Method>() else {
                    continue;
                };
                let params = op["parameters"].as_array().into_iter().flatten();
                let names: Vec<String> = params
                    .clone()
                    .filter(|p| p["in"] == "query")
                    .filter_map(|p| p["name"].as_str().map(str::to_string))
                    .collect();
                queries.insert((method.clone(), path.clone()), names);
                let ints: Vec<IntegerParam> = params
                    .filter(|p| is_integer(&p["schema"]))
                    .map(|p| IntegerParam {
                        name: p["name"].as_str().unwrap_or_default().to_string(),
                        in_path: p["in"] == "path",
                        min: bound(&p["schema"]["minimum"]).unwrap_or(i64::MIN as i128),
                        max: bound(&p["schema"]["maximum"]).unwrap_or(i64::MAX as i128),
                    })
                    .collect();
                let json_body = &op["requestBody"]["content"]["application/json"]["schema"];
                if !json_body.is_null() {
                    bodies.insert((method.clone(), path.clone()), body_schema(&doc, json_body));
                }
                if let Some(reqs) = op["security"].as_array().filter(|s| !s.is_empty()) {
                    let scopes = reqs
                        .iter()
                        .filter_map(|r| r["token"].as_array())
                        .flatten()
                        .filter_map(|s| Scope::parse(s.as_str()?).ok())
                        .collect();
                    secured.insert((method.clone(), path.clone()), scopes);
                }
                integers.insert((method, path.clone()), ints);
            }
        }
        Edge {
            integers,
            queries,
            api_routes,
            bodies,
            secured,
            max_body_bytes,
            body_timeout,
        }
    }

    /// Whether the operation `method` `route` needs a token (HEAD is GET's).
    pub fn needs_token(&self, method: &Method, route: &str) -> bool {
        self.scopes(method, route).is_some()
    }

    /// The scopes that may call the operation `method` `route` (any of them; empty: any
    /// valid token), or `None` where it needs no token.
    pub fn scopes(&self, method: &Method, route: &str) -> Option<&[Scope]> {
        let method = if method == Method::HEAD {
            Method::GET
        } else {
            method.clone()
        };
        self.secured
            .get(&(method, route.to_string()))
            .map(Vec::as_slice)
    }
}

/// A validator for one operation's JSON body: its schema, with the document's components
/// beside it so that `#/components/schemas/...` references resolve (OpenAPI 3.1 schemas are
/// JSON Schema 2020-12).
fn body_schema(doc: &serde_json::Value, schema: &serde_json::Value) -> BodySchema {
    let name = schema["$ref"]
        .as_str()
        .and_then(|r| r.rsplit('/').next())
        .unwrap_or("the request body")
        .to_string();
    let mut root = schema.clone();
    if let Some(obj) = root.as_object_mut() {
        obj.insert("components".into(), doc["components"].clone());
    }
    let validator = jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .build(&root)
        .unwrap_or_else(|e| panic!("the OpenAPI schema of {name} does not compile: {e}"));
    BodySchema { name, validator }
}

/// A JSON body is held to its operation's schema: the first broken rule is refused with 422,
/// naming the field (`report.lease_id`) and the schema to read.
fn check_body_schema(schema: &BodySchema, v: &serde_json::Value) -> Result<(), AppError> {
    let Some(err) = schema.validator.iter_errors(v).next() else {
        return Ok(());
    };
    let field = err
        .instance_path()
        .as_str()
        .trim_start_matches('/')
        .replace('/', ".");
    let what = if field.is_empty() {
        "the JSON body".to_string()
    } else {
        format!("JSON field `{}`", quote(&field))
    };
    // The message quotes the value that broke the rule: never more than a short prefix of it,
    // so that a large body is not sent back to its sender.
    let mut msg = err.to_string();
    let value = err.instance().to_string();
    if value.len() > MAX_ECHO {
        let cut = (0..=MAX_ECHO)
            .rev()
            .find(|&i| value.is_char_boundary(i))
            .unwrap_or(0);
        let short = format!("{}… ({} bytes)", &value[..cut], value.len());
        msg = msg.replacen(&value, &short, 1);
        if msg.len() > 4 * MAX_ECHO {
            msg = format!(
                "{short} breaks the rule at `{}`",
                err.schema_path().as_str()
            );
        }
    }
    Err(AppError::unprocessable(format!(
        "{what} breaks the request schema: {msg}; see `{}` in /openapi.json",
        schema.name
    ))
    .with("field", field.as_str()))
}

/// The most of a refused value an error message quotes (bytes).
const MAX_ECHO: usize = 120;

fn is_integer(schema: &serde_json::Value) -> bool {
    match &schema["type"] {
        serde_json::Value::String(t) => t == "integer",
        serde_json::Value::Array(ts) => ts.iter().any(|t| t == "integer"),
        _ => false,
    }
}

fn bound(v: &serde_json::Value) -> Option<i128> {
    v.as_i64()
        .map(i128::from)
        .or_else(|| v.as_u64().map(i128::from))
        .or_else(|| v.as_f64().map(|f| f as i128))
}

/// Which characters a text value may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Text {
    /// A name, an id, a parameter: one line of printable text, no control characters.
    Line,
    /// Free text (a source, a reason): anything but NUL.
    Free,
}

/// The text rule: `what` names the value for a person (`query parameter \`op\``), `field`
/// for a program (the problem's `field` member).
pub fn check_text(what: &str, field: &str, value: &str, kind: Text) -> Result<(), AppError> {
    let bad = match kind {
        Text::Line => value.char_indices().find(|(_, c)| c.is_control()),
        Text::Free => value.char_indices().find(|(_, c)| *c == '\0'),
    };
    let Some((at, c)) = bad else {
        return Ok(());
    };
    let why = if c == '\0' {
        "NUL cannot be stored; remove it".to_string()
    } else {
        "it must be one line of printable text; remove it".to_string()
    };
    Err(AppError::bad_request(format!(
        "{what} holds the control character U+{:04X} at byte {at}: {why}",
        c as u32
    ))
    .with("field", field))
}

/// Every routed request passes here (a route layer: it knows the matched route).
pub async fn guard(
    State(edge): State<Arc<Edge>>,
    matched: Option<MatchedPath>,
    raw_path: Result<RawPathParams, axum::extract::rejection::RawPathParamsRejection>,
    req: Request,
    next: Next,
) -> Response {
    let route = matched.map(|m| m.as_str().to_string()).unwrap_or_default();
    let is_page = !edge.api_routes.contains(&route);
    match check(&edge, &route, !is_page, raw_path, req).await {
        Ok(req) => next.run(req).await,
        Err(e) if is_page => PageError::from(e).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn check(
    edge: &Edge,
    route: &str,
    is_api: bool,
    raw_path: Result<RawPathParams, axum::extract::rejection::RawPathParamsRejection>,
    req: Request,
) -> Result<Request, AppError> {
    let method = if req.method() == Method::HEAD {
        Method::GET
    } else {
        req.method().clone()
    };
    let none = (Vec::new(), Vec::new());
    let key = (method, route.to_string());
    let integers = edge.integers.get(&key).unwrap_or(&none.0);
    let declared_queries = edge.queries.get(&key).unwrap_or(&none.1);

    // Path parameters.
    let path_params: Vec<(String, String)> = match raw_path {
        Ok(p) => p
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        Err(axum::extract::rejection::RawPathParamsRejection::InvalidUtf8InPathParam(e)) => {
            return Err(AppError::bad_request(format!(
                "{}: a path parameter must be UTF-8 text once percent-decoded",
                e.body_text()
            )));
        }
        Err(_) => Vec::new(),
    };
    for (name, value) in &path_params {
        check_text(&format!("path parameter `{name}`"), name, value, Text::Line)?;
        if let Some(p) = integers.iter().find(|p| p.in_path && p.name == *name) {
            check_integer(p, "path parameter", value)?;
        }
    }

    // Query parameters: decoded as axum's `Query` decodes them, but refusing what is not UTF-8
    // rather than replacing it.
    if let Some(query) = req.uri().query() {
        let mut seen: HashSet<String> = HashSet::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let key = decode_component(k).map_err(|_| {
                AppError::bad_request(format!(
                    "a query parameter's name (`{}`) is not UTF-8 text once percent-decoded; percent-encode UTF-8 bytes",
                    quote(k)
                ))
            })?;
            check_text("a query parameter's name", &key, &key, Text::Line)?;
            // Pages refuse a repeated parameter as the API does (a 400 page, not the last value).
            if !seen.insert(key.clone()) {
                return Err(AppError::bad_request(format!(
                    "query parameter `{}` is given more than once; give it once",
                    quote(&key)
                ))
                .with("field", key.as_str()));
            }
            if is_api && !declared_queries.contains(&key) {
                let takes = if declared_queries.is_empty() {
                    "this route takes none".to_string()
                } else {
                    format!("this route takes: {}", declared_queries.join(", "))
                };
                return Err(AppError::bad_request(format!(
                    "unknown query parameter `{}`; {takes}",
                    quote(&key)
                ))
                .with("field", key.as_str()));
            }
            let value = decode_component(v).map_err(|_| {
                AppError::bad_request(format!(
                    "query parameter `{}` is not UTF-8 text once percent-decoded; percent-encode UTF-8 bytes",
                    quote(&key)
                ))
                .with("field", key.as_str())
            })?;
            check_text(
                &format!("query parameter `{}`", quote(&key)),
                &key,
                &value,
                Text::Line,
            )?;
            if is_api {
                check_trimmed(&key, &value)?;
            }
            if let Some(p) = integers.iter().find(|p| !p.in_path && p.name == key) {
                let v = value.trim();
                if !v.is_empty() {
                    check_integer(p, "query parameter", v)?;
                }
            }
        }
    }

    // The body: read whole, bounded in size and time, then its text checked.
    let (parts, body) = req.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > (edge.max_body_bytes + DRAIN_BYTES) as u64) {
        return Err(too_large(edge.max_body_bytes));
    }
    // While its body arrives the connection waits on its client: without a valid token it may
    // be closed to make room for a new connection (`listener`).
    let waiting = parts
        .extensions
        .get::<crate::listener::Connection>()
        .filter(|_| {
            parts
                .extensions
                .get::<crate::state::Caller>()
                .is_none_or(|c| c.name.is_none())
        })
        .map(|c| c.waiting());
    let bytes = read_body(body, edge).await;
    drop(waiting);
    let bytes = bytes?;
    let ctype = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    // The media type is case-insensitive; the boundary is not.
    if ctype
        .to_ascii_lowercase()
        .starts_with("multipart/form-data")
    {
        check_multipart(ctype, &bytes).await?;
    } else if let Some(schema) = edge.bodies.get(&key).filter(|_| is_json(ctype)) {
        // A body that is not JSON is left to the handler, which says what is wrong with it.
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes) {
            check_json("", &v)?;
            check_body_schema(schema, &v)?;
        }
    } else if bytes.windows(6).any(|w| w == b"\\u0000") {
        // Only a body that may decode to a NUL is parsed here; the handler parses it anyway.
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes) {
            check_json("", &v)?;
        }
    }
    Ok(Request::from_parts(parts, Body::from(bytes)))
}

/// A JSON media type, as axum's `Json` takes them (`application/json`, `application/*+json`).
fn is_json(ctype: &str) -> bool {
    let essence = ctype
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// An API query parameter is given with a value, and without surrounding spaces (the forms of
/// the dashboard's pages send empty fields: pages are not held to this).
fn check_trimmed(key: &str, value: &str) -> Result<(), AppError> {
    let why = if value.trim().is_empty() {
        "is empty: give a value or leave the parameter out"
    } else if value.trim() != value {
        "has leading or trailing spaces: remove them"
    } else {
        return Ok(());
    };
    Err(AppError::bad_request(format!("query parameter `{}` {why}", quote(key))).with("field", key))
}

fn check_integer(p: &IntegerParam, kind: &str, value: &str) -> Result<(), AppError> {
    let ok = value
        .parse::<i128>()
        .ok()
        .filter(|n| (p.min..=p.max).contains(n));
    if ok.is_some() {
        return Ok(());
    }
    Err(AppError::bad_request(format!(
        "{kind} `{}` must be a whole number from {} to {}; `{}` is not",
        p.name,
        p.min,
        p.max,
        quote(value)
    ))
    .with("field", p.name.as_str()))
}

/// Percent-decode a query component (`+` is a space), refusing bytes that are not UTF-8.
fn decode_component(s: &str) -> Result<String, std::str::Utf8Error> {
    let plus = s.replace('+', " ");
    let bytes: Vec<u8> = percent_encoding::percent_decode_str(&plus).collect();
    std::str::from_utf8(&bytes).map(str::to_string)
}

/// 413, closing the connection: the rest of the body is not read.
fn too_large(max: usize) -> AppError {
    AppError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!(
            "the request body is larger than the server accepts ({max} bytes); kernel sources are limited to {} KiB",
            kernel_registry::manifest::MAX_SOURCE_BYTES >> 10
        ),
    )
    .header(header::CONNECTION, HeaderValue::from_static("close"))
}

/// Beyond the limit, read and drop this much more of a body before answering 413: a client
/// still sending when the connection closes may see a reset instead of the answer.
const DRAIN_BYTES: usize = 8 << 20;

async fn read_body(body: Body, edge: &Edge) -> Result<Bytes, AppError> {
    read(body, edge.max_body_bytes, edge.body_timeout, true).await
}

/// Read a request's body and drop it, under the edge's limits (408, 413): a request refused
/// before its body is looked at (`app::authenticate_first`) still reads what its client sends,
/// so that the client gets the answer rather than a reset connection.
pub async fn drain(body: Body, edge: &Edge) -> Result<(), AppError> {
    read(body, edge.max_body_bytes, edge.body_timeout, false)
        .await
        .map(|_| ())
}

async fn read(
    mut body: Body,
    max_body_bytes: usize,
    body_timeout: Duration,
    keep: bool,
) -> Result<Bytes, AppError> {
    let deadline = tokio::time::Instant::now() + body_timeout;
    let mut data = BytesMut::new();
    let mut seen = 0usize;
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => {
                return Err(AppError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    format!(
                        "the request body did not arrive within {} s; send the whole body at once (the connection is closed)",
                        body_timeout.as_secs_f64()
                    ),
                )
                .header(header::CONNECTION, HeaderValue::from_static("close")))
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                return Err(AppError::bad_request(format!(
                    "the request body could not be read ({e}); send it again"
                ))
                .header(header::CONNECTION, HeaderValue::from_static("close")))
            }
            Ok(Some(Ok(frame))) => frame,
        };
        if let Ok(chunk) = frame.into_data() {
            seen = seen.saturating_add(chunk.len());
            if seen <= max_body_bytes {
                if keep {
                    data.extend_from_slice(&chunk);
                }
            } else if seen > max_body_bytes + DRAIN_BYTES {
                break;
            }
        }
    }
    if seen > max_body_bytes {
        return Err(too_large(max_body_bytes));
    }
    Ok(data.freeze())
}

/// The first NUL in a JSON value's strings or keys, named by its path (`report.cases[3].id`).
fn check_json(at: &str, v: &serde_json::Value) -> Result<(), AppError> {
    let what = |field: &str| {
        if field.is_empty() {
            "the JSON body".to_string()
        } else {
            format!("JSON field `{}`", quote(field))
        }
    };
    match v {
        serde_json::Value::String(s) => check_text(&what(at), at, s, Text::Free),
        serde_json::Value::Array(items) => items
            .iter()
            .enumerate()
            .try_for_each(|(i, x)| check_json(&format!("{at}[{i}]"), x)),
        serde_json::Value::Object(map) => map.iter().try_for_each(|(k, x)| {
            let field = if at.is_empty() {
                k.clone()
            } else {
                format!("{at}.{k}")
            };
            check_text(&format!("a key of {}", what(at)), &field, k, Text::Free)?;
            check_json(&field, x)
        }),
        _ => Ok(()),
    }
}

/// Every multipart part of this API is text: UTF-8 without NUL. A body that is not valid
/// multipart is left to the handler, which says what is wrong with it.
async fn check_multipart(ctype: &str, bytes: &Bytes) -> Result<(), AppError> {
    let req = Request::builder()
        .header(header::CONTENT_TYPE, ctype)
        .body(Body::from(bytes.clone()))
        .expect("a request from valid parts");
    let Ok(mut mp) = Multipart::from_request(req, &()).await else {
        return Ok(());
    };
    while let Ok(Some(field)) = mp.next_field().await {
        let name = field.name().unwrap_or("").to_string();
        let Ok(data) = field.bytes().await else {
            return Ok(());
        };
        let what = format!("multipart part `{}`", quote(&name));
        let text = std::str::from_utf8(&data).map_err(|e| {
            AppError::bad_request(format!(
                "{what} is not UTF-8 text ({e}); send the kernel.toml and the .cu source as UTF-8"
            ))
            .with("field", name.as_str())
        })?;
        check_text(&what, &name, text, Text::Free)?;
    }
    Ok(())
}

/// Around every route and fallback: a refusal made below the handlers (an extractor's
/// plain-text rejection, a caught panic) is rewritten as problem+json, keeping its status and
/// headers. Problems and HTML pages pass as they are.
pub async fn problems(req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let res = next.run(req).await;
    let status = res.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return res;
    }
    let ctype = res
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if ctype.starts_with(PROBLEM_JSON) || ctype.starts_with("text/html") {
        return res;
    }
    let (mut parts, body) = res.into_parts();
    let text = match Limited::new(body, 16 << 10).collect().await {
        Ok(c) => String::from_utf8_lossy(&c.to_bytes()).trim().to_string(),
        Err(_) => String::new(),
    };
    let detail = match status {
        StatusCode::INTERNAL_SERVER_ERROR => {
            tracing::error!(%method, %path, detail = %text, "internal error below the handlers");
            "the server failed to handle this request; it has been logged".to_string()
        }
        _ if !text.is_empty() => format!(
            "{} (see /openapi.json for this route's rules)",
            quote_at(&text, 1000)
        ),
        _ => format!(
            "{} (see /openapi.json for this route's rules)",
            status.canonical_reason().unwrap_or("refused")
        ),
    };
    let problem = AppError::new(status, detail).into_response();
    let (pparts, pbody) = problem.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        pparts.headers[header::CONTENT_TYPE].clone(),
    );
    Response::from_parts(parts, pbody)
}

/// The router's fallback: no route has this path.
pub async fn no_route(method: Method, uri: axum::http::Uri) -> AppError {
    AppError::not_found(format!(
        "no route {} {}; see /openapi.json for the API",
        quote(method.as_str()),
        quote(uri.path())
    ))
}

/// A route's fallback for methods it does not take (axum adds the `Allow` header).
pub async fn method_not_allowed(method: Method, uri: axum::http::Uri) -> AppError {
    AppError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!(
            "{} is not allowed on {}; the `Allow` header lists the methods it takes (see /openapi.json)",
            quote(method.as_str()),
            quote(uri.path())
        ),
    )
}

/// Turn a panic into a 500 (logged), so that a bug is an answer, not a dropped connection.
pub fn panic_to_500(err: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let what = err
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| err.downcast_ref::<&str>().copied())
        .unwrap_or("a panic");
    tracing::error!(panic = %what, "a handler panicked");
    AppError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "the server failed to handle this request; it has been logged",
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_rule_names_the_character_and_the_field() {
        let e = check_text("query parameter `op`", "op", "a\0b", Text::Line).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.detail.contains("U+0000 at byte 1"), "{}", e.detail);
        assert_eq!(e.extra["field"], "op");
        assert!(check_text("x", "x", "tab\there", Text::Line).is_err());
        assert!(check_text("x", "x", "tab\there\nnewline", Text::Free).is_ok());
        assert!(check_text("x", "x", "emoji 😀 é", Text::Line).is_ok());
    }

    #[test]
    fn json_nul_is_named_by_its_path() {
        let v = serde_json::json!({"report": {"cases": [{"id": "a"}, {"id": "b\u{0}"}]}});
        let e = check_json("", &v).unwrap_err();
        assert_eq!(e.extra["field"], "report.cases[1].id");
        let key = serde_json::json!({"ok": {"k\u{0}": 1}});
        assert_eq!(
            check_json("", &key).unwrap_err().extra["field"],
            "ok.k\u{0}"
        );
        assert!(check_json("", &serde_json::json!({"s": "\\u0000 as text"})).is_ok());
    }

    /// The edge of the real document: each body rule it states is held, and a valid body passes.
    #[test]
    fn json_bodies_are_held_to_the_documents_schemas() {
        let edge = Edge::new(crate::routes::openapi(), 1 << 20, Duration::from_secs(1));
        let claim = &edge.bodies[&(Method::POST, "/v1/jobs/claim".to_string())];
        assert_eq!(claim.name, "ClaimRequest");
        let refused = |schema: &BodySchema, v: serde_json::Value| {
            let e = check_body_schema(schema, &v).unwrap_err();
            assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", e.detail);
            assert!(e.detail.contains("see `"), "{}", e.detail);
            e.extra["field"].as_str().unwrap_or_default().to_string()
        };
        // A pattern (a newline the handler would trim), a length, a type, a missing and an
        // unknown field.
        assert_eq!(
            refused(claim, serde_json::json!({"worker": "\ns"})),
            "worker"
        );
        let long = "x".repeat(201);
        assert_eq!(
            refused(claim, serde_json::json!({"worker": long})),
            "worker"
        );
        assert_eq!(refused(claim, serde_json::json!({"worker": 7})), "worker");
        assert_eq!(refused(claim, serde_json::json!({})), "");
        assert_eq!(
            refused(claim, serde_json::json!({"worker": "a", "x": 1})),
            ""
        );
        assert!(check_body_schema(claim, &serde_json::json!({"worker": "host/H200 é"})).is_ok());
        let token = &edge.bodies[&(Method::POST, "/v1/tokens".to_string())];
        let t = serde_json::json!({"name": "ci", "scopes": ["submit", 3]});
        assert_eq!(refused(token, t), "scopes.1");
        let ok = serde_json::json!({"name": "ci", "scopes": ["submit"], "expires_in": null});
        assert!(check_body_schema(token, &ok).is_ok());
        assert!(is_json("application/json; charset=utf-8") && is_json("application/problem+json"));
        assert!(!is_json("text/plain") && !is_json("multipart/form-data; boundary=x"));
    }

    #[test]
    fn query_components_decode_like_forms_and_refuse_bad_utf8() {
        assert_eq!(decode_component("a+b%20c").unwrap(), "a b c");
        assert_eq!(decode_component("%00").unwrap(), "\0");
        assert!(decode_component("%FF").is_err());
        assert!(
            decode_component("%ED%A0%80").is_err(),
            "an encoded lone surrogate"
        );
    }
}
