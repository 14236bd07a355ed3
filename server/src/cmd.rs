//! The CLI's subcommands beyond `serve`.

pub mod client;
pub mod db;
pub mod health;
pub mod keys;
pub mod python;
pub mod reverify;
pub mod submit;
pub mod verify;
pub mod worker;
