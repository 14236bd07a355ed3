//! The stale list: kernels whose newest verdict on an architecture was measured by another
//! suite or with another driver than the newest, or whose compiled code was not audited (a
//! verification from before the capability audit, or an audit that could not read every
//! module: every policy refuses it until a new verification audits it), or that were verified
//! elsewhere but never there (`Store::stale_on`), read from `newest_verifications`,
//! `verification_facts` and `verification_verdicts`.

use crate::codec::bound;
use crate::kernel_rows::{k_cols, kernel_conditions, kernel_row, KernelQuery, KernelRow};
use crate::{Result, Store};
use kernel_registry::capability::UNAUDITED_FLAGS;
use kernel_registry::Arch;
use sqlx::Row;

/// The join that picks, for kernel `k`, its newest verification `n` on the architecture bound
/// as `$1`.
const NEWEST_ON_ARCH: &str = "newest_verifications n ON n.kernel_digest = k.digest AND n.arch = $1";

impl Store {
    /// Kernels matching `q`'s filters (its `arch` is the architecture asked about) whose newest
    /// verdict on that architecture is stale — measured by another suite than `suite`, or with
    /// another driver than `newest_driver`, or not audited (its stored capability flags are
    /// `UNAUDITED_FLAGS`) — or that were verified elsewhere but never there:
    /// a page of them in list order with the suite and driver of that verdict and whether it was
    /// not audited (`None`: never verified there), and their total.
    pub async fn stale_on(
        &self,
        arch: Arch,
        q: &KernelQuery,
        suite: &str,
        newest_driver: Option<&str>,
    ) -> Result<(Vec<(KernelRow, Option<(String, String, bool)>)>, i64)> {
        let mut binds = vec![arch.to_string()];
        let mut conds = kernel_conditions(
            &KernelQuery {
                arch: Some(arch),
                ..q.clone()
            },
            &mut binds,
        );
        binds.push(suite.to_string());
        let mut stale = format!("f.suite_version <> ${}", binds.len());
        if let Some(d) = newest_driver {
            binds.push(d.to_string());
            stale.push_str(&format!(" OR f.driver_version <> ${}", binds.len()));
        }
        binds.push(UNAUDITED_FLAGS.to_string());
        let unaudited = format!(
            "EXISTS (SELECT 1 FROM verification_verdicts d WHERE \
             d.verification_id = n.verification_id AND d.capabilities = ${})",
            binds.len()
        );
        stale.push_str(&format!(" OR {unaudited}"));
        conds.push(format!(
            "((n.verification_id IS NOT NULL AND ({stale})) OR (n.verification_id IS NULL AND \
             EXISTS (SELECT 1 FROM newest_verifications o WHERE o.kernel_digest = k.digest)))"
        ));
        let from = format!(
            "FROM kernels k LEFT JOIN {NEWEST_ON_ARCH} \
             LEFT JOIN verification_facts f ON f.verification_id = n.verification_id WHERE {}",
            conds.join(" AND ")
        );
        let total = self
            .count_with(&format!("SELECT COUNT(*) {from}"), &binds)
            .await?;
        let sql = format!(
            "SELECT {}, f.suite_version AS v_suite, f.driver_version AS v_driver, \
             CASE WHEN {unaudited} THEN 1 ELSE 0 END AS v_unaudited {from} \
             ORDER BY k.op, k.semantics, k.name, k.id LIMIT ${} OFFSET ${}",
            k_cols(),
            binds.len() + 1,
            binds.len() + 2
        );
        let query = bound(&sql, &binds);
        let rows = query
            .bind(q.limit)
            .bind(q.offset)
            .fetch_all(&self.pool)
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let suite: Option<String> = r.try_get("v_suite")?;
            let driver: Option<String> = r.try_get("v_driver")?;
            let unaudited = r.try_get::<i32, _>("v_unaudited")? != 0;
            out.push((
                kernel_row(r)?,
                suite.zip(driver).map(|(s, d)| (s, d, unaudited)),
            ));
        }
        Ok((out, total))
    }
}
