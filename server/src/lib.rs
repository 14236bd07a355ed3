//! kernelize's service: the HTTP API, the dashboard, the GPU worker and the CLI behind the
//! `kernelize` binary. A request goes `listener` -> `app` (its layers, `routes`' list) -> `edge`
//! -> `api::*` -> `kernel_store`, every handler taking `state`'s `AppState` and `Caller`; a job
//! goes `api::jobs` -> `cmd::worker` -> `verifier`.

pub mod answers;
pub mod api;
pub mod app;
pub mod bundled;
pub mod cli;
pub mod cmd;
pub mod dashboard;
pub mod edge;
pub mod error;
pub mod listener;
pub mod metrics;
pub mod protocol;
pub mod request_id;
pub mod resolve;
pub mod routes;
pub mod stale;
pub mod state;
pub mod token_file;
