//! The database argument every subcommand that opens the store takes (`--db`, `KERNELIZE_DB`).
//! Its own module so that the subcommands (`cmd::keys`) and the top-level CLI (`cli`) both use
//! it without importing each other.

use kernel_store::DEFAULT_DB_URL;

#[derive(clap::Args, Debug)]
pub struct DbArgs {
    /// Database URL: sqlite://PATH or postgres://USER@HOST:PORT/DB.
    #[arg(long, env = "KERNELIZE_DB", default_value = DEFAULT_DB_URL)]
    pub db: String,
}
