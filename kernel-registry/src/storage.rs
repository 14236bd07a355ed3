//! Storage: SQLite (embedded default) or PostgreSQL, chosen by URL.
