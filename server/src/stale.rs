//! When a verdict is stale: measured by an older suite than this hub's verifier runs, or with
//! another driver than the newest one this hub's workers of that architecture report, or its
//! compiled code was not audited (every policy refuses it until it is verified again). A stale
//! verdict still counts (it is the newest evidence there is); the API and the dashboard say it
//! is stale and why, and `kernelize verify-request --stale` queues its re-verification.

use kernel_registry::Arch;
use kernel_store::{Store, StoreError, VerificationRow};
use std::collections::HashMap;

/// Why a verdict whose compiled code was not audited is stale.
pub const NOT_AUDITED: &str = "its compiled code was not audited (a verification from before the capability audit, or an audit that could not read every module): every policy refuses it until it is verified again";

/// Staleness checks for one request (the newest driver per architecture is read once).
pub struct Staleness<'a> {
    store: &'a Store,
    suite: &'static str,
    drivers: HashMap<Arch, Option<String>>,
}

impl<'a> Staleness<'a> {
    pub fn new(store: &'a Store) -> Staleness<'a> {
        Staleness {
            store,
            suite: verifier::cases::SUITE_VERSION,
            drivers: HashMap::new(),
        }
    }

    /// Why `v` is stale (empty: it is not).
    pub async fn of(&mut self, v: &VerificationRow) -> Result<Vec<String>, StoreError> {
        let r = &v.report;
        let mut why = self
            .of_parts(v.arch, &r.suite_version, &r.device.driver_version)
            .await?;
        if r.audit().is_some_and(|a| !a.audited) {
            why.push(NOT_AUDITED.to_string());
        }
        Ok(why)
    }

    /// Why a verdict on `arch` measured by `suite` with `driver` is stale (empty: it is not).
    pub async fn of_parts(
        &mut self,
        arch: Arch,
        suite: &str,
        driver: &str,
    ) -> Result<Vec<String>, StoreError> {
        let mut why = Vec::new();
        if suite != self.suite {
            why.push(format!(
                "measured by suite {suite}; this hub's verifier runs suite {}",
                self.suite
            ));
        }
        if !self.drivers.contains_key(&arch) {
            let d = self.store.newest_driver(arch).await?;
            self.drivers.insert(arch, d);
        }
        if let Some(newest) = self.drivers[&arch].as_deref().filter(|d| *d != driver) {
            why.push(format!(
                "measured with driver {driver}; the newest verification on {arch} ran driver {newest}"
            ));
        }
        Ok(why)
    }

    /// `v` as JSON with its `stale` reasons.
    pub async fn json(&mut self, v: &VerificationRow) -> Result<serde_json::Value, StoreError> {
        let mut j = serde_json::to_value(v).expect("verification serialises");
        j["stale"] = serde_json::json!(self.of(v).await?);
        Ok(j)
    }
}
