//! The OpenAPI document, generated from the handlers' annotations.

use axum::Json;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

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

#[derive(OpenApi)]
#[openapi(
    info(title = "kernelize", description = "A kernel hub that hands out only verified layer replacements."),
    paths(
        super::healthz,
        super::kernels::list, super::kernels::get_one, super::kernels::verifications,
        super::kernels::source, super::kernels::submit,
        super::jobs::claim, super::jobs::get_job, super::jobs::heartbeat, super::jobs::report,
        super::jobs::fail, super::jobs::verification,
        super::resolve::resolve,
        openapi_json,
    ),
    modifiers(&TokenAuth)
)]
pub struct ApiDoc;

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "meta", responses((status = 200, description = "OpenAPI 3.1 document")))]
pub async fn openapi_json() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
