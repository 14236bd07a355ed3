//! The newest verdicts of every kernel in memory, kept up to date a write at a time: what a
//! resolve ranks and the policy list filters, so that the first ask of a query after a write
//! reads no group or list from the database. `Store::verdict_index` brings it to a generation:
//! the first time with a full read (in chunks), then with the kernels and verifications that
//! `answer_changes` (migration 0012) lists since the generation it holds, a few rows per write,
//! on every replica. Kernels and verification summaries are immutable, so an entry once read
//! stays right. A policy is decided here by `Policy::passes` on each verdict's `VerdictFacts`,
//! built from the stored columns (tests compare every answer with `Policy::evaluate` on the
//! full reports).

use crate::codec::{parse_col, parse_csv};
use crate::newest::{CandidateKernel, NewestVerdict, VerdictOn, VerdictParts};
use crate::{KernelQuery, Result, Store, StoreError};
use kernel_registry::policy::VerdictFacts;
use kernel_registry::report::{Coverage, ModelReport, SpeedAt, Verdict, ULP_INFINITE};
use kernel_registry::{Arch, DType, Op, Policy, Semantics};
use sqlx::any::AnyRow;
use sqlx::Row;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, RwLock};

/// Rows read per query while loading or catching up (SQLite has one connection: each query
/// holds it for a few milliseconds at most).
const CHUNK: usize = 256;

/// The in-memory verdicts of a store (one per `Store`, shared by its clones).
#[derive(Default)]
pub struct VerdictIndex {
    state: RwLock<Index>,
    /// One catch-up at a time (the others wait and find it done).
    catching_up: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for VerdictIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerdictIndex")
            .field("generation", &self.read().generation)
            .finish()
    }
}

#[derive(Default)]
struct Index {
    /// The generation held (`None`: not loaded yet).
    generation: Option<i64>,
    kernels: HashMap<i64, Kernel>,
    by_digest: HashMap<String, i64>,
    /// Op groups in list order (op, then semantics, as the database sorts them), each with its
    /// kernels' ids in list order (name, then id).
    groups: Vec<Group>,
    /// Per kernel digest: the newest verification id per architecture.
    newest: HashMap<String, Vec<(Arch, i64)>>,
    /// Verifications read (every newest one, and those they replaced since the load).
    entries: HashMap<i64, Arc<Entry>>,
    /// Distinct certifying keys per kernel digest, architecture and overall class (all
    /// verifications, for `confirmed:N`).
    keys: HashMap<(String, Arch, String), BTreeSet<String>>,
}

struct Group {
    op: Op,
    semantics: Semantics,
    ids: Vec<i64>,
}

struct Kernel {
    candidate: Arc<CandidateKernel>,
    op: Op,
    semantics: Semantics,
    /// Its newest verification per architecture (from `Index::newest`, by `Index::refresh`).
    newest: Vec<Arc<Entry>>,
}

/// A verification as the resolve and the policy list read it.
struct Entry {
    id: i64,
    arch: Arch,
    class: Arc<str>,
    suite_version: Arc<str>,
    driver_version: Arc<str>,
    requested_cols: Arc<[u64]>,
    device_name: Arc<str>,
    /// The GPU's SMs and threads per SM (`None`: a report without them).
    sm_count: Option<u32>,
    threads_per_sm: Option<u32>,
    created_at: Arc<str>,
    /// Per dtype with a verdict.
    verdicts: Vec<DtypeVerdict>,
    /// Per dtype, sorted by cols.
    coverage: Vec<(DType, Arc<[Coverage]>)>,
    /// Per dtype, in case order.
    speeds: Vec<(DType, Arc<[SpeedAt]>)>,
}

struct DtypeVerdict {
    dtype: DType,
    /// What the policy decides on, from the stored columns (`facts_of_columns`).
    facts: VerdictFacts,
    /// Shared: the policy walks `facts` of many verdicts and reads few of these, which a
    /// resolve's failing lines then hold without a copy.
    parts: Arc<VerdictParts>,
}

/// A `verification_verdicts` row's facts as a policy reads them. The columns are the report's
/// values as stored: counts and distances clamped to 2^63-1 (a stored `max_ulp` of 2^63-1
/// stands for `ULP_INFINITE`), NaN stored as NULL (read back as NaN), infinities as +-1e308.
fn facts_of_columns(r: &AnyRow) -> Result<VerdictFacts> {
    let i = |c: &str| -> Result<i64> { Ok(r.try_get::<i64, _>(c)?) };
    let flag = |c: &str| -> Result<bool> { Ok(i(c)? == 1) };
    let count = |c: &str| -> Result<u64> { Ok(i(c)?.max(0) as u64) };
    let float =
        |c: &str| -> Result<f64> { Ok(r.try_get::<Option<f64>, _>(c)?.unwrap_or(f64::NAN)) };
    let max_ulp = i("max_ulp")?;
    Ok(VerdictFacts {
        cases_run: count("cases_run")?,
        integrity_ok: flag("integrity_ok")?,
        mismatches: count("mismatches")?,
        nonfinite_parity: flag("nonfinite_parity")?,
        deterministic: flag("deterministic")?,
        batch_invariant: flag("batch_invariant")?,
        within_tolerance: flag("within_tolerance")?,
        max_ulp: if max_ulp == i64::MAX {
            ULP_INFINITE
        } else {
            max_ulp.max(0) as u64
        },
        max_abs_diff: float("max_abs_diff")?,
        max_mismatch_fraction: float("max_mismatch_fraction")?,
        models: count("models")?,
        argmax_failures: count("argmax_failures")?,
        capabilities: r.try_get("capabilities")?,
    })
}

/// A verdict of one dtype as a policy checks it: `Policy::passes` on its stored facts.
#[derive(Debug, Clone)]
pub struct VerdictCheck(VerdictFacts);

impl VerdictCheck {
    pub fn passes(&self, policy: &Policy) -> bool {
        policy.passes(&self.0)
    }
}

impl Entry {
    fn verdict(&self, dtype: DType) -> Option<&DtypeVerdict> {
        self.verdicts.iter().find(|v| v.dtype == dtype)
    }

    /// The coverage of `dtype`, sorted by cols (`None`: no case of it ran).
    fn coverage_at(&self, dtype: DType) -> Option<&Arc<[Coverage]>> {
        self.coverage
            .iter()
            .find(|(d, _)| *d == dtype)
            .map(|(_, c)| c)
    }

    /// The timed cases of `dtype`, in case order (`None`: none).
    fn speeds_at(&self, dtype: DType) -> Option<&Arc<[SpeedAt]>> {
        self.speeds
            .iter()
            .find(|(d, _)| *d == dtype)
            .map(|(_, s)| s)
    }
}

impl Kernel {
    fn newest_on(&self, arch: Arch) -> Option<&Arc<Entry>> {
        self.newest.iter().find(|e| e.arch == arch)
    }

    fn newest_any(&self) -> Option<&Arc<Entry>> {
        self.newest.iter().max_by_key(|e| e.id)
    }
}

impl Index {
    /// The kernels of the op group (`op`, `semantics`) in list order (none for a group not
    /// stored).
    fn group(&self, op: Op, semantics: Semantics) -> impl Iterator<Item = &Kernel> + '_ {
        self.groups
            .iter()
            .find(|g| g.op == op && g.semantics == semantics)
            .into_iter()
            .flat_map(move |g| g.ids.iter().filter_map(move |id| self.kernels.get(id)))
    }

    /// Point the kernel of `digest` (if stored) at its newest verifications.
    fn refresh(&mut self, digest: &str) {
        let Some(k) = self
            .by_digest
            .get(digest)
            .and_then(|id| self.kernels.get_mut(id))
        else {
            return;
        };
        k.newest = self
            .newest
            .get(digest)
            .into_iter()
            .flatten()
            .filter_map(|(_, id)| self.entries.get(id).cloned())
            .collect();
    }

    fn certifying_keys(&self, digest: &str, e: &Entry) -> i64 {
        self.keys
            .get(&(digest.to_string(), e.arch, e.class.to_string()))
            .map_or(0, |k| k.len() as i64)
    }

    /// `k` as a resolve's candidate on `arch`, with its newest verification there (`newest`).
    /// Without a policy: `passes` is false and `certifying_keys` is counted (see
    /// `VerdictIndex::policy_free_inputs`).
    fn candidate(
        &self,
        k: &Kernel,
        newest: Option<&Arc<Entry>>,
        arch: Arch,
        dtype: DType,
        policy: Option<&Policy>,
    ) -> NewestVerdict {
        let digest = k.candidate.digest.as_str();
        let on = newest.map(|e| VerdictOn {
            verification_id: e.id,
            arch,
            device_name: e.device_name.clone(),
            sm_count: e.sm_count,
            threads_per_sm: e.threads_per_sm,
            created_at: e.created_at.clone(),
            class: e.class.clone(),
            suite_version: e.suite_version.clone(),
            driver_version: e.driver_version.clone(),
            passes: policy.is_some_and(|p| e.verdict(dtype).is_some_and(|d| p.passes(&d.facts))),
            certifying_keys: if policy.is_none_or(|p| p.confirmations > 0) {
                self.certifying_keys(digest, e)
            } else {
                0
            },
            requested_cols: e.requested_cols.clone(),
        });
        let elsewhere = match on {
            Some(_) => vec![],
            None => {
                let mut a: Vec<Arch> = k.newest.iter().map(|e| e.arch).collect();
                a.sort_by_key(|a| a.to_string());
                a
            }
        };
        NewestVerdict {
            kernel: k.candidate.clone(),
            on,
            elsewhere,
        }
    }

    fn ranking_input(
        &self,
        k: &Kernel,
        newest: Option<&Arc<Entry>>,
        arch: Arch,
        dtype: DType,
        policy: Option<&Policy>,
    ) -> RankingInput {
        RankingInput {
            candidate: self.candidate(k, newest, arch, dtype, policy),
            coverage: newest
                .and_then(|e| e.coverage_at(dtype).cloned())
                .unwrap_or_else(|| Arc::from([])),
            speeds: newest
                .and_then(|e| e.speeds_at(dtype).cloned())
                .unwrap_or_else(|| Arc::from([])),
        }
    }

    fn add_kernel(&mut self, k: Kernel) {
        self.by_digest
            .insert(k.candidate.digest.as_str().to_string(), k.candidate.id);
        self.kernels.insert(k.candidate.id, k);
    }

    fn add_facts(&mut self, f: &Facts) {
        if let Some(key) = &f.cert_key {
            self.keys
                .entry((f.digest.clone(), f.arch, f.class.clone()))
                .or_default()
                .insert(key.clone());
        }
        let newest = self.newest.entry(f.digest.clone()).or_default();
        match newest.iter_mut().find(|(a, _)| *a == f.arch) {
            Some((_, id)) => *id = (*id).max(f.id),
            None => newest.push((f.arch, f.id)),
        }
    }

    /// The verification ids that are newest somewhere but not read yet.
    fn missing_entries(&self) -> Vec<i64> {
        let mut ids: Vec<i64> = self
            .newest
            .values()
            .flatten()
            .map(|(_, id)| *id)
            .filter(|id| !self.entries.contains_key(id))
            .collect();
        ids.sort_unstable();
        ids
    }
}

/// A resolve's candidate with its verdict's coverage and timed cases of the asked dtype (empty:
/// none, or not verified on the architecture).
#[derive(Debug, Clone, PartialEq)]
pub struct RankingInput {
    pub candidate: NewestVerdict,
    pub coverage: Arc<[Coverage]>,
    pub speeds: Arc<[SpeedAt]>,
}

/// A `verification_facts` row.
struct Facts {
    id: i64,
    digest: String,
    arch: Arch,
    class: String,
    suite_version: String,
    driver_version: String,
    cert_key: Option<String>,
    requested_cols: Vec<u64>,
    device_name: String,
    sm_count: Option<u32>,
    threads_per_sm: Option<u32>,
    created_at: String,
}

const KERNEL_SELECT: &str = "SELECT id, name, version, digest, op, semantics, dtypes, archs, \
     cols_min, cols_max, cols_multiple_of, runtime FROM kernels";
const FACTS_SELECT: &str = "SELECT verification_id, kernel_digest, arch, class, suite_version, \
     driver_version, cert_key, requested_cols, device_name, sm_count, threads_per_sm, created_at \
     FROM verification_facts";

fn kernel_of(r: &AnyRow) -> Result<Kernel> {
    Ok(Kernel {
        candidate: Arc::new(CandidateKernel::of_row(r)?),
        op: parse_col(r, "op")?,
        semantics: parse_col(r, "semantics")?,
        newest: vec![],
    })
}

fn facts_of(r: &AnyRow) -> Result<Facts> {
    Ok(Facts {
        id: r.try_get("verification_id")?,
        digest: r.try_get("kernel_digest")?,
        arch: parse_col(r, "arch")?,
        class: r.try_get("class")?,
        suite_version: r.try_get("suite_version")?,
        driver_version: r.try_get("driver_version")?,
        cert_key: r.try_get("cert_key")?,
        requested_cols: parse_csv(&r.try_get::<String, _>("requested_cols")?)?,
        device_name: r.try_get("device_name")?,
        sm_count: small(r.try_get("sm_count")?),
        threads_per_sm: small(r.try_get("threads_per_sm")?),
        created_at: r.try_get("created_at")?,
    })
}

/// A stored GPU figure (`None`: not stored, or not a u32).
fn small(v: Option<i64>) -> Option<u32> {
    v.and_then(|v| u32::try_from(v).ok())
}

fn ids_list(ids: &[i64]) -> String {
    ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

impl Store {
    /// The verdict index, brought to at least `generation` (the store's answer generation as
    /// the caller read it).
    pub async fn verdict_index(&self, generation: i64) -> Result<&VerdictIndex> {
        let index = &*self.index;
        if index.read().generation.is_some_and(|g| g >= generation) {
            return Ok(index);
        }
        let _one = index.catching_up.lock().await;
        let held = index.read().generation;
        match held {
            Some(g) if g >= generation => {}
            Some(g) => self.catch_up(index, g, generation).await?,
            None => self.load_index(index).await?,
        }
        Ok(index)
    }

    /// Read everything, in chunks: every kernel, every verification's facts, and the verdicts,
    /// coverage and speeds of the newest ones.
    async fn load_index(&self, index: &VerdictIndex) -> Result<()> {
        // Changes after this generation may be read here too; catching up reads them again,
        // and adding a kernel or a verification twice changes nothing.
        let generation = self.answer_generation().await?;
        let mut ix = Index::default();
        self.each_in_chunks(KERNEL_SELECT, "id", |r| {
            let k = kernel_of(r)?;
            let id = k.candidate.id;
            ix.add_kernel(k);
            Ok(id)
        })
        .await?;
        let mut facts = HashMap::new();
        self.each_in_chunks(FACTS_SELECT, "verification_id", |r| {
            let f = facts_of(r)?;
            let id = f.id;
            ix.add_facts(&f);
            facts.insert(id, f);
            Ok(id)
        })
        .await?;
        let newest = ix.missing_entries();
        ix.entries = self.read_entries(&newest, &facts).await?;
        let groups: HashSet<(Op, Semantics)> =
            ix.kernels.values().map(|k| (k.op, k.semantics)).collect();
        let known: HashSet<i64> = ix.kernels.keys().copied().collect();
        ix.groups = self
            .order_groups(&[], groups, HashMap::new(), &known)
            .await?;
        let digests: Vec<String> = ix.by_digest.keys().cloned().collect();
        for d in &digests {
            ix.refresh(d);
        }
        ix.generation = Some(generation);
        *index.write() = ix;
        Ok(())
    }

    /// Every row of `select` (a query without a WHERE clause) in order of its column `key`,
    /// `CHUNK` rows per query (keyset paging), each given to `each`, which returns its key.
    async fn each_in_chunks(
        &self,
        select: &str,
        key: &str,
        mut each: impl FnMut(&AnyRow) -> Result<i64>,
    ) -> Result<()> {
        let sql = format!("{select} WHERE {key} > $1 ORDER BY {key} LIMIT {CHUNK}");
        let mut after = i64::MIN;
        loop {
            let rows = sqlx::query(&sql).bind(after).fetch_all(&self.pool).await?;
            for r in &rows {
                after = each(r)?;
            }
            if rows.len() < CHUNK {
                return Ok(());
            }
        }
    }

    /// Read what changed after generation `held` up to `generation` and apply it.
    async fn catch_up(&self, index: &VerdictIndex, held: i64, generation: i64) -> Result<()> {
        let rows = sqlx::query(
            "SELECT kernel_id, verification_id FROM answer_changes WHERE n > $1 AND n <= $2 \
             ORDER BY n",
        )
        .bind(held)
        .bind(generation)
        .fetch_all(&self.pool)
        .await?;
        let mut kernel_ids = vec![];
        let mut verification_ids = vec![];
        for r in &rows {
            if let Some(id) = r.try_get::<Option<i64>, _>("kernel_id")? {
                kernel_ids.push(id);
            }
            if let Some(id) = r.try_get::<Option<i64>, _>("verification_id")? {
                verification_ids.push(id);
            }
        }
        let mut kernels: Vec<Kernel> = vec![];
        for chunk in kernel_ids.chunks(CHUNK) {
            for r in sqlx::query(&format!(
                "{KERNEL_SELECT} WHERE id IN ({})",
                ids_list(chunk)
            ))
            .fetch_all(&self.pool)
            .await?
            {
                kernels.push(kernel_of(&r)?);
            }
        }
        let mut facts = HashMap::new();
        for chunk in verification_ids.chunks(CHUNK) {
            for r in sqlx::query(&format!(
                "{FACTS_SELECT} WHERE verification_id IN ({})",
                ids_list(chunk)
            ))
            .fetch_all(&self.pool)
            .await?
            {
                let f = facts_of(&r)?;
                facts.insert(f.id, f);
            }
        }
        let entries = self.read_entries(&verification_ids, &facts).await?;
        // The op groups that gained a kernel are read again in list order (the database's
        // order of text, whatever its collation). Only this task changes the index meanwhile.
        let groups = if kernels.is_empty() {
            None
        } else {
            let touched: HashSet<(Op, Semantics)> =
                kernels.iter().map(|k| (k.op, k.semantics)).collect();
            let (order, kept, mut known) = {
                let ix = index.read();
                let order: Vec<(Op, Semantics)> =
                    ix.groups.iter().map(|g| (g.op, g.semantics)).collect();
                let kept: HashMap<(Op, Semantics), Vec<i64>> = ix
                    .groups
                    .iter()
                    .map(|g| ((g.op, g.semantics), g.ids.clone()))
                    .collect();
                let known: HashSet<i64> = ix.kernels.keys().copied().collect();
                (order, kept, known)
            };
            known.extend(kernels.iter().map(|k| k.candidate.id));
            Some(self.order_groups(&order, touched, kept, &known).await?)
        };
        let mut touched: HashSet<String> = facts.values().map(|f| f.digest.clone()).collect();
        touched.extend(
            kernels
                .iter()
                .map(|k| k.candidate.digest.as_str().to_string()),
        );
        let mut ix = index.write();
        for k in kernels {
            ix.add_kernel(k);
        }
        for f in facts.values() {
            ix.add_facts(f);
        }
        for (id, e) in entries {
            ix.entries.entry(id).or_insert(e);
        }
        for d in &touched {
            ix.refresh(d);
        }
        if let Some(groups) = groups {
            ix.groups = groups;
        }
        ix.generation = Some(generation);
        Ok(())
    }

    /// The verdicts, coverage and speeds of `ids` (with their `facts`), in chunks.
    async fn read_entries(
        &self,
        ids: &[i64],
        facts: &HashMap<i64, Facts>,
    ) -> Result<HashMap<i64, Arc<Entry>>> {
        let mut out = HashMap::new();
        for chunk in ids.chunks(CHUNK) {
            let list = ids_list(chunk);
            let mut verdicts: HashMap<i64, Vec<DtypeVerdict>> = HashMap::new();
            for r in sqlx::query(&format!(
                "SELECT verification_id, dtype, cases_run, integrity_ok, mismatches, \
                 nonfinite_parity, deterministic, batch_invariant, within_tolerance, max_ulp, \
                 models, argmax_failures, max_abs_diff, max_mismatch_fraction, verdict_json, \
                 models_json, capabilities, capabilities_json FROM verification_verdicts \
                 WHERE verification_id IN ({list})"
            ))
            .fetch_all(&self.pool)
            .await?
            {
                let id: i64 = r.try_get("verification_id")?;
                let corrupt = |what: &str, e: serde_json::Error| {
                    StoreError::Corrupt(format!("verification {id}: {what}: {e}"))
                };
                let verdict: Verdict =
                    serde_json::from_str(&r.try_get::<String, _>("verdict_json")?)
                        .map_err(|e| corrupt("verdict", e))?;
                let models: Vec<ModelReport> =
                    serde_json::from_str(&r.try_get::<String, _>("models_json")?)
                        .map_err(|e| corrupt("models", e))?;
                verdicts.entry(id).or_default().push(DtypeVerdict {
                    dtype: parse_col(&r, "dtype")?,
                    facts: facts_of_columns(&r)?,
                    parts: Arc::new(VerdictParts {
                        verdict: Some(verdict),
                        models,
                        capabilities: crate::newest::parse_capabilities(
                            id,
                            r.try_get::<Option<String>, _>("capabilities_json")?,
                        )?,
                    }),
                });
            }
            let mut coverage: HashMap<i64, Vec<(DType, Vec<Coverage>)>> = HashMap::new();
            for r in sqlx::query(&format!(
                "SELECT verification_id, dtype, cols, rows_min, rows_max, row_counts \
                 FROM verification_coverage WHERE verification_id IN ({list}) \
                 ORDER BY verification_id, dtype, cols"
            ))
            .fetch_all(&self.pool)
            .await?
            {
                let i = |c: &str| -> Result<u64> { Ok(r.try_get::<i64, _>(c)? as u64) };
                let c = Coverage {
                    dtype: parse_col(&r, "dtype")?,
                    cols: i("cols")?,
                    rows_min: i("rows_min")?,
                    rows_max: i("rows_max")?,
                    row_counts: parse_csv(&r.try_get::<String, _>("row_counts")?)?,
                };
                let per_dtype = coverage.entry(r.try_get("verification_id")?).or_default();
                match per_dtype.last_mut() {
                    Some((d, cs)) if *d == c.dtype => cs.push(c),
                    _ => per_dtype.push((c.dtype, vec![c])),
                }
            }
            let mut speeds: HashMap<i64, Vec<(DType, Vec<SpeedAt>)>> = HashMap::new();
            for r in sqlx::query(&format!(
                "SELECT verification_id, dtype, rows, cols, gbps, median_us, copy_fraction, \
                 speedup FROM verification_speeds WHERE verification_id IN ({list}) \
                 ORDER BY verification_id, dtype, case_index"
            ))
            .fetch_all(&self.pool)
            .await?
            {
                let (dtype, speed): (DType, SpeedAt) =
                    (parse_col(&r, "dtype")?, crate::summary::speed_row(&r, "")?);
                let per_dtype = speeds.entry(r.try_get("verification_id")?).or_default();
                match per_dtype.last_mut() {
                    Some((d, ss)) if *d == dtype => ss.push(speed),
                    _ => per_dtype.push((dtype, vec![speed])),
                }
            }
            for id in chunk {
                let Some(f) = facts.get(id) else {
                    continue; // no facts: not a verification the reads know
                };
                out.insert(
                    *id,
                    Arc::new(Entry {
                        id: *id,
                        arch: f.arch,
                        class: f.class.as_str().into(),
                        suite_version: f.suite_version.as_str().into(),
                        driver_version: f.driver_version.as_str().into(),
                        requested_cols: f.requested_cols.as_slice().into(),
                        device_name: f.device_name.as_str().into(),
                        sm_count: f.sm_count,
                        threads_per_sm: f.threads_per_sm,
                        created_at: f.created_at.as_str().into(),
                        verdicts: verdicts.remove(id).unwrap_or_default(),
                        coverage: coverage
                            .remove(id)
                            .unwrap_or_default()
                            .into_iter()
                            .map(|(d, c)| (d, c.into()))
                            .collect(),
                        speeds: speeds
                            .remove(id)
                            .unwrap_or_default()
                            .into_iter()
                            .map(|(d, s)| (d, s.into()))
                            .collect(),
                    }),
                );
            }
        }
        Ok(out)
    }

    /// The op groups in list order: `order` (the order held) when it has every group of
    /// `reread`, else the database's order of (op, semantics); the groups in `reread` with
    /// their kernel ids read again in list order (only ids in `known`), the others from
    /// `kept`.
    async fn order_groups(
        &self,
        order: &[(Op, Semantics)],
        reread: HashSet<(Op, Semantics)>,
        mut kept: HashMap<(Op, Semantics), Vec<i64>>,
        known: &HashSet<i64>,
    ) -> Result<Vec<Group>> {
        let order: Vec<(Op, Semantics)> = if reread.iter().all(|g| order.contains(g)) {
            order.to_vec()
        } else {
            let mut all = vec![];
            for r in sqlx::query(
                "SELECT op, semantics FROM kernels GROUP BY op, semantics ORDER BY op, semantics",
            )
            .fetch_all(&self.pool)
            .await?
            {
                let g = (parse_col(&r, "op")?, parse_col(&r, "semantics")?);
                // A group stored after the generation read has no kernel known yet.
                if order.contains(&g) || reread.contains(&g) {
                    all.push(g);
                }
            }
            all
        };
        let mut out = vec![];
        for g in order {
            let ids = if reread.contains(&g) {
                let mut ids = vec![];
                for r in sqlx::query(
                    "SELECT id FROM kernels WHERE op = $1 AND semantics = $2 ORDER BY name, id",
                )
                .bind(g.0.as_str())
                .bind(g.1.as_str())
                .fetch_all(&self.pool)
                .await?
                {
                    let id: i64 = r.try_get("id")?;
                    if known.contains(&id) {
                        ids.push(id);
                    }
                }
                ids
            } else {
                kept.remove(&g).unwrap_or_default()
            };
            out.push(Group {
                op: g.0,
                semantics: g.1,
                ids,
            });
        }
        Ok(out)
    }
}

impl VerdictIndex {
    // A panic while holding the lock leaves whole entries only: still good to read.
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Index> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Index> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The generation this index holds (`None`: not loaded).
    pub fn generation(&self) -> Option<i64> {
        self.read().generation
    }

    /// Every kernel of `op` and `semantics`, in list order, with its newest verification on
    /// `arch` and whether that verification's `dtype` verdict meets `policy`: a resolve's
    /// candidates.
    pub fn newest_verdicts(
        &self,
        op: Op,
        semantics: Semantics,
        arch: Arch,
        dtype: DType,
        policy: &Policy,
    ) -> Vec<NewestVerdict> {
        let ix = self.read();
        ix.group(op, semantics)
            .map(|k| ix.candidate(k, k.newest_on(arch), arch, dtype, Some(policy)))
            .collect()
    }

    /// The coverage of `dtype` of each of `ids` (those it holds), each sorted by cols.
    pub fn coverage_of(&self, ids: &[i64], dtype: DType) -> HashMap<i64, Arc<[Coverage]>> {
        let ix = self.read();
        ids.iter()
            .filter_map(|id| Some((*id, ix.entries.get(id)?.coverage_at(dtype)?.clone())))
            .collect()
    }

    /// The timed cases of `dtype` of each of `ids` (those it holds), in case order.
    pub fn speeds_of(&self, ids: &[i64], dtype: DType) -> HashMap<i64, Vec<SpeedAt>> {
        let ix = self.read();
        ids.iter()
            .filter_map(|id| Some((*id, ix.entries.get(id)?.speeds_at(dtype)?.to_vec())))
            .collect()
    }

    /// `newest_verdicts` with each verdict's coverage and timed cases of `dtype` (empty when it
    /// has none), in one pass: what a resolve ranks.
    pub fn ranking_inputs(
        &self,
        op: Op,
        semantics: Semantics,
        arch: Arch,
        dtype: DType,
        policy: &Policy,
    ) -> Vec<RankingInput> {
        let ix = self.read();
        let mut out = Vec::new();
        for k in ix.group(op, semantics) {
            let newest = k.newest_on(arch);
            out.push(ix.ranking_input(k, newest, arch, dtype, Some(policy)));
        }
        out
    }

    /// `ranking_inputs` for any policy: each candidate's `passes` is false and its
    /// `certifying_keys` counted, with its dtype's `VerdictCheck` (`None`: no verdict of the
    /// dtype on the architecture, so no policy passes it). A ranking for a policy is then a
    /// pass over these in memory (the server keeps them per answer generation).
    pub fn policy_free_inputs(
        &self,
        op: Op,
        semantics: Semantics,
        arch: Arch,
        dtype: DType,
    ) -> Vec<(RankingInput, Option<VerdictCheck>)> {
        let ix = self.read();
        ix.group(op, semantics)
            .map(|k| {
                let newest = k.newest_on(arch);
                let check = newest
                    .and_then(|e| e.verdict(dtype))
                    .map(|d| VerdictCheck(d.facts.clone()));
                (ix.ranking_input(k, newest, arch, dtype, None), check)
            })
            .collect()
    }

    /// `Store::verdict_parts` from memory (for verifications it holds; others have no verdict),
    /// shared with the index.
    pub fn verdict_parts(&self, ids: &[i64], dtype: DType) -> HashMap<i64, Arc<VerdictParts>> {
        let ix = self.read();
        ids.iter()
            .map(|id| {
                let parts = ix
                    .entries
                    .get(id)
                    .and_then(|e| e.verdict(dtype))
                    .map(|d| d.parts.clone())
                    .unwrap_or_else(|| {
                        Arc::new(VerdictParts {
                            verdict: None,
                            models: vec![],
                            capabilities: None,
                        })
                    });
                (*id, parts)
            })
            .collect()
    }

    /// The policy list: the ids of the kernels matching `q`'s filters (whatever its page) whose
    /// newest verification (on `q.arch`, else on any architecture) meets `policy` for `q.dtype`
    /// (or for one of the kernel's dtypes) and has `confirmed:N` certifications, in list order
    /// (op, semantics, name, id). A caller reads its pages by id (`Store::kernels_by_ids`).
    pub fn approved_ids(&self, q: &KernelQuery, policy: &Policy) -> Vec<i64> {
        let ix = self.read();
        let mut out = vec![];
        for g in &ix.groups {
            if q.op.is_some_and(|op| op != g.op) || q.semantics.is_some_and(|s| s != g.semantics) {
                continue;
            }
            for id in &g.ids {
                let Some(k) = ix.kernels.get(id) else {
                    continue;
                };
                let c = &k.candidate;
                if q.dtype.is_some_and(|d| !c.dtypes.contains(&d)) {
                    continue;
                }
                if q.arch.is_some_and(|a| {
                    !c.constraints.archs.is_empty() && !c.constraints.archs.contains(&a)
                }) {
                    continue;
                }
                let digest = c.digest.as_str();
                let newest = match q.arch {
                    Some(a) => k.newest_on(a),
                    None => k.newest_any(),
                };
                let Some(e) = newest else {
                    continue;
                };
                let meets = e.verdicts.iter().any(|d| {
                    q.dtype
                        .map_or(c.dtypes.contains(&d.dtype), |want| d.dtype == want)
                        && policy.passes(&d.facts)
                });
                if meets
                    && (policy.confirmations == 0
                        || ix.certifying_keys(digest, e) >= policy.confirmations as i64)
                {
                    out.push(*id);
                }
            }
        }
        out
    }
}
