//! kernelize's service: the HTTP API, the dashboard, the GPU worker and the CLI behind the
//! `kernelize` binary. A request goes `app` -> `api::*` -> `kernel_registry::storage`; a job
//! goes `api::jobs` -> `cmd::worker` -> `verifier`.

pub mod api;
pub mod app;
pub mod bundled;
pub mod cmd;
pub mod dashboard;
pub mod error;
pub mod resolve;
