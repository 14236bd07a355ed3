//! The CLI's subcommands beyond `serve`.

pub mod verify;
