//! The CLI's subcommands beyond `serve`.

pub mod client;
pub mod submit;
pub mod verify;
pub mod worker;
