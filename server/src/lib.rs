//! kernelize's service: the HTTP API, the dashboard, the GPU worker and the CLI behind the
//! `kernelize` binary. A request goes `listener` -> `app` (its route list) -> `edge` ->
//! `api::*` -> `kernel_store`; a job goes `api::jobs` -> `cmd::worker` -> `verifier`.

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
pub mod stale;
pub mod token_file;
