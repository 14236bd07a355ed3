//! The one list of API routes, from which both the router (`crate::app`) and the OpenAPI
//! document come, and the scopes each operation needs.

use crate::api;
use crate::state::{AppState, Caller, Scope};
use axum::Json;
use std::sync::OnceLock;
use utoipa::OpenApi;
use utoipa_axum::{router::OpenApiRouter, routes};

/// Every API route, each registered together with its OpenAPI operation (`routes!` reads the
/// handler's `#[utoipa::path]`): the router, the document and the tests' route table all
/// come from this list.
pub fn api_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(api::openapi::ApiDoc::openapi())
        .routes(routes!(api::healthz))
        .routes(routes!(api::metrics))
        .routes(routes!(openapi_json))
        .routes(routes!(api::kernels::list, api::kernels::submit))
        .routes(routes!(api::kernels::get_one))
        .routes(routes!(api::kernels::verifications))
        .routes(routes!(api::kernels::verify_request))
        .routes(routes!(api::kernels::source))
        .routes(routes!(api::jobs::verification))
        .routes(routes!(api::jobs::claim))
        .routes(routes!(api::jobs::get_job))
        .routes(routes!(api::jobs::heartbeat))
        .routes(routes!(api::jobs::report))
        .routes(routes!(api::jobs::fail))
        .routes(routes!(api::tokens::list, api::tokens::create))
        .routes(routes!(api::tokens::revoke))
        .routes(routes!(api::resolve::resolve))
        .routes(routes!(api::resolve::request_verifications))
}

/// The OpenAPI document of `api_routes`, with what the edge answers on every route declared.
pub fn openapi() -> &'static utoipa::openapi::OpenApi {
    static DOC: OnceLock<utoipa::openapi::OpenApi> = OnceLock::new();
    DOC.get_or_init(|| {
        let mut doc = api_routes().split_for_parts().1;
        api::openapi::declare_the_edge(&mut doc);
        declare_scopes_and_limits(&mut doc);
        doc
    })
}

/// The scopes that may call each operation that needs a token (any one of them; admin holds
/// every scope). The OpenAPI document's `security` requirements are written from this table,
/// and the edge reads them there: a token without one of them is refused (403) before the
/// request's body is read. A handler may ask more once it has read the body (a Python
/// candidate needs `submit-python`).
pub const OPERATION_SCOPES: &[(&str, &str, &[Scope])] = &[
    ("POST", "/v1/kernels", &[Scope::Submit, Scope::SubmitPython]),
    (
        "POST",
        "/v1/kernels/{name}/{version}/verify",
        &[Scope::Admin],
    ),
    ("POST", "/v1/jobs/claim", &[Scope::Worker]),
    ("POST", "/v1/jobs/{id}/heartbeat", &[Scope::Worker]),
    ("POST", "/v1/jobs/{id}/report", &[Scope::Worker]),
    ("POST", "/v1/jobs/{id}/fail", &[Scope::Worker]),
    ("GET", "/v1/tokens", &[Scope::Admin]),
    ("POST", "/v1/tokens", &[Scope::Admin]),
    ("POST", "/v1/tokens/{token}/revoke", &[Scope::Admin]),
    ("POST", "/v1/resolve/verifications", &[Scope::Submit]),
];

/// Each secured operation's requirement names its scopes (`OPERATION_SCOPES`), and every
/// operation but `/healthz` declares the 429 of the rate limits.
fn declare_scopes_and_limits(doc: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::header::HeaderBuilder;
    use utoipa::openapi::security::SecurityRequirement;
    use utoipa::openapi::{Content, ObjectBuilder, Ref, RefOr, ResponseBuilder, Type};
    for (path, item) in doc.paths.paths.iter_mut() {
        let ops = [
            ("GET", &mut item.get),
            ("POST", &mut item.post),
            ("PUT", &mut item.put),
            ("DELETE", &mut item.delete),
            ("PATCH", &mut item.patch),
        ];
        for (method, op) in ops {
            let Some(op) = op else { continue };
            let secured = op.security.as_ref().is_some_and(|s| !s.is_empty());
            if secured {
                let scopes = OPERATION_SCOPES
                    .iter()
                    .find(|(m, p, _)| *m == method && p == path)
                    .map(|(_, _, scopes)| *scopes)
                    .unwrap_or_default();
                op.security = Some(vec![SecurityRequirement::new(
                    "token",
                    scopes.iter().map(|s| s.as_str()),
                )]);
            }
            if path == "/healthz" {
                continue;
            }
            let mut why = "Too many requests without a token from this client address (`serve --anonymous-rate-per-minute`; a request with a valid token is not limited by address)".to_string();
            if secured {
                why.push_str(
                    ", or too many writes by this token (`serve --write-rate-per-minute`)",
                );
            }
            why.push_str("; retry after `Retry-After` seconds");
            let retry_after = HeaderBuilder::new()
                .schema(
                    ObjectBuilder::new()
                        .schema_type(Type::Integer)
                        .minimum(Some(1)),
                )
                .description(Some("Seconds to wait before the next request"))
                .build();
            let response = ResponseBuilder::new()
                .description(why)
                .content(
                    crate::error::PROBLEM_JSON,
                    Content::new(Some(Ref::from_schema_name("Problem"))),
                )
                .header("Retry-After", retry_after)
                .build();
            op.responses
                .responses
                .insert("429".to_string(), RefOr::T(response));
        }
    }
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "meta", responses((status = 200, description = "OpenAPI 3.1 document")))]
pub async fn openapi_json(_c: Caller) -> Json<utoipa::openapi::OpenApi> {
    Json(openapi().clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::openapi::{MAX_EXTENT, MAX_OFFSET, MAX_PAGE};
    use kernel_registry::{DType, Op, Semantics};

    /// A new operation that needs a token cannot be left without its scopes (then any valid
    /// token would pass the edge), and the table names only such operations.
    #[test]
    fn every_operation_that_needs_a_token_names_its_scopes() {
        let doc = serde_json::to_value(openapi()).unwrap();
        let mut secured = Vec::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                let Some(reqs) = op["security"].as_array() else {
                    continue;
                };
                let scopes = reqs[0]["token"].as_array().unwrap();
                assert!(
                    !scopes.is_empty(),
                    "{method} {path} needs a token: add its scopes to OPERATION_SCOPES"
                );
                secured.push((method.to_uppercase(), path.clone()));
            }
        }
        for (method, path, _) in OPERATION_SCOPES {
            assert!(
                secured.contains(&(method.to_string(), path.to_string())),
                "{method} {path} is in OPERATION_SCOPES but needs no token"
            );
        }
        assert_eq!(secured.len(), OPERATION_SCOPES.len());
    }

    #[test]
    fn declared_bounds_are_these() {
        let doc = serde_json::to_value(openapi()).unwrap();
        let bounds = |path: &str, name: &str| -> (i64, i64) {
            let p = doc["paths"][path]["get"]["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == name)
                .unwrap_or_else(|| panic!("{path} has no `{name}`"));
            let n = |k: &str| {
                p["schema"][k]
                    .as_i64()
                    .unwrap_or_else(|| panic!("{name}.{k}"))
            };
            (n("minimum"), n("maximum"))
        };
        assert_eq!(bounds("/v1/kernels", "limit"), (1, MAX_PAGE));
        assert_eq!(bounds("/v1/kernels", "offset"), (0, MAX_OFFSET));
        assert_eq!(bounds("/v1/resolve", "cols"), (1, MAX_EXTENT as i64));
        assert_eq!(bounds("/v1/resolve", "rows"), (1, MAX_EXTENT as i64));
    }

    #[test]
    fn declared_values_are_the_domain_lists() {
        let doc = serde_json::to_value(openapi()).unwrap();
        let schemas = &doc["components"]["schemas"];
        let listed = |name: &str| -> Vec<String> {
            schemas[name]["enum"]
                .as_array()
                .unwrap_or_else(|| panic!("{name} has no enum"))
                .iter()
                .map(|v| v.as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(
            listed("Op"),
            Op::ALL.iter().map(|o| o.to_string()).collect::<Vec<_>>()
        );
        assert_eq!(
            listed("DType"),
            DType::ALL.iter().map(|o| o.to_string()).collect::<Vec<_>>()
        );
        assert_eq!(
            listed("Semantics"),
            Semantics::ALL
                .iter()
                .map(|o| o.to_string())
                .collect::<Vec<_>>()
        );
    }

    /// The schema's limit on a token name is the store's (utoipa takes only a literal).
    #[test]
    fn the_documented_name_limit_is_the_stores() {
        let doc = serde_json::to_value(openapi()).unwrap();
        let max =
            &doc["components"]["schemas"]["CreateTokenRequest"]["properties"]["name"]["maxLength"];
        assert_eq!(
            max.as_u64(),
            Some(kernel_store::MAX_TOKEN_NAME as u64),
            "{max}"
        );
    }
}
