//! The verification dashboard (server-rendered HTML).

use crate::app::AppState;
use axum::response::Redirect;
use axum::routing::get;
use axum::Router;

pub fn routes() -> Router<AppState> {
    Router::new().route("/", get(|| async { Redirect::temporary("/v1/kernels") }))
}
