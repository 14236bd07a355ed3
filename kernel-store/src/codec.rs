//! How list and enum values are written to and read from the schema's text columns, and the
//! text binds of the store's dynamic-filter queries (`bound`, `Store::count_with`).

use crate::{Result, Store, StoreError};
use sqlx::any::AnyRow;
use sqlx::Row;

/// A list as `,a,b,` (empty: ``), so that `LIKE '%,a,%'` finds one member.
pub(crate) fn csv<T: ToString>(items: impl IntoIterator<Item = T>) -> String {
    let parts: Vec<String> = items.into_iter().map(|t| t.to_string()).collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!(",{},", parts.join(","))
    }
}

pub(crate) fn parse_csv<T: std::str::FromStr>(s: &str) -> Result<Vec<T>> {
    s.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.parse()
                .map_err(|_| StoreError::Corrupt(format!("stored list value `{p}`")))
        })
        .collect()
}

pub(crate) fn parse_col<T: std::str::FromStr>(row: &AnyRow, col: &str) -> Result<T> {
    let s: String = row.try_get(col)?;
    s.parse()
        .map_err(|_| StoreError::Corrupt(format!("column {col} holds `{s}`")))
}

/// A float a column can hold (NaN and infinities are not portable across backends).
pub(crate) fn finite_or(x: f64, or: f64) -> f64 {
    if x.is_finite() {
        x
    } else {
        or
    }
}

/// `sql` with its text binds applied in order (the dynamic-filter queries of the store).
pub(crate) fn bound<'q>(
    sql: &'q str,
    binds: &'q [String],
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>> {
    binds
        .iter()
        .fold(sqlx::query(sql), |q, b| q.bind(b.as_str()))
}

/// `bytes` random bytes as lowercase hex (tokens, lease ids).
pub(crate) fn random_hex(bytes: usize) -> String {
    use rand::RngCore;
    let mut b = vec![0u8; bytes];
    rand::thread_rng().fill_bytes(&mut b);
    hex::encode(b)
}

impl Store {
    /// The count that `sql` (a `SELECT COUNT(*)` with `binds` applied in order) answers.
    pub(crate) async fn count_with(&self, sql: &str, binds: &[String]) -> Result<i64> {
        Ok(bound(sql, binds).fetch_one(&self.pool).await?.try_get(0)?)
    }
}
