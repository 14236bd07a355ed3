-- Issue 17: queries by index, not by loop.
--
-- The newest verification of every kernel on every architecture, kept by a trigger in the
-- transaction that stores a verification: resolve, the policy-filtered list and the dashboard
-- read it with one join instead of reading every verification of every kernel.
CREATE TABLE newest_verifications (
    kernel_digest   TEXT NOT NULL REFERENCES kernels(digest),
    arch            TEXT NOT NULL,
    verification_id BIGINT NOT NULL REFERENCES verifications(id),
    PRIMARY KEY (kernel_digest, arch)
);
CREATE INDEX newest_verifications_arch ON newest_verifications (arch, kernel_digest);
INSERT INTO newest_verifications (kernel_digest, arch, verification_id)
    SELECT kernel_digest, arch, MAX(id) FROM verifications GROUP BY kernel_digest, arch;
CREATE FUNCTION kernelize_keep_newest() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO newest_verifications (kernel_digest, arch, verification_id)
    VALUES (NEW.kernel_digest, NEW.arch, NEW.id)
    ON CONFLICT (kernel_digest, arch) DO UPDATE SET verification_id = excluded.verification_id
    WHERE excluded.verification_id > newest_verifications.verification_id;
    RETURN NULL;
END;
$$;
CREATE TRIGGER verifications_keep_newest AFTER INSERT ON verifications
    FOR EACH ROW EXECUTE FUNCTION kernelize_keep_newest();

-- What a policy is checked against, per verification and dtype: the report's per-dtype verdict
-- as indexed columns (a policy becomes a WHERE clause) and as JSON (the lines that say why a
-- kernel fails), with its model-level (argmax) measurements. Written with the verification;
-- rows of verifications stored before this migration are computed from their reports by
-- `Store::migrate` (SQL cannot read the report JSON).
CREATE TABLE verification_verdicts (
    verification_id       BIGINT NOT NULL REFERENCES verifications(id),
    dtype                 TEXT NOT NULL,
    class                 TEXT NOT NULL,
    class_rank            BIGINT NOT NULL, -- 0 bit_exact, 1 ulp:N, 2 tolerance, 3 fails
    class_ulp             BIGINT NOT NULL, -- N of ulp:N, else 0
    cases_run             BIGINT NOT NULL,
    integrity_ok          BIGINT NOT NULL,
    mismatches            BIGINT NOT NULL,
    nonfinite_parity      BIGINT NOT NULL,
    deterministic         BIGINT NOT NULL,
    batch_invariant       BIGINT NOT NULL,
    within_tolerance      BIGINT NOT NULL,
    max_ulp               BIGINT NOT NULL, -- clamped to 2^63-1 (ULP_INFINITE)
    max_abs_diff          DOUBLE PRECISION,            -- NULL: NaN
    max_mismatch_fraction DOUBLE PRECISION,            -- NULL: NaN
    models                BIGINT NOT NULL, -- model-level measurements of this dtype
    argmax_failures       BIGINT NOT NULL, -- of those, how many changed an argmax
    verdict_json          TEXT NOT NULL,
    models_json           TEXT NOT NULL,
    PRIMARY KEY (verification_id, dtype)
);

-- Every measured speed of a verification (one row per timed case), so that the speed at the
-- shape nearest a query is read without the report; `headline` marks the case nearest the
-- dashboard's 4096x8192 per dtype.
CREATE TABLE verification_speeds (
    verification_id BIGINT NOT NULL REFERENCES verifications(id),
    dtype           TEXT NOT NULL,
    case_index      BIGINT NOT NULL,
    rows            BIGINT NOT NULL,
    cols            BIGINT NOT NULL,
    gbps            DOUBLE PRECISION NOT NULL,
    median_us       DOUBLE PRECISION NOT NULL,
    copy_fraction   DOUBLE PRECISION NOT NULL,
    speedup         DOUBLE PRECISION NOT NULL,
    headline        BIGINT NOT NULL,
    PRIMARY KEY (verification_id, dtype, case_index)
);

-- One row per verification: what staleness and confirmed:N need (suite, driver, certifying
-- key), and the widths it was asked for, without the report.
CREATE TABLE verification_facts (
    verification_id BIGINT PRIMARY KEY REFERENCES verifications(id),
    kernel_digest   TEXT NOT NULL,
    arch            TEXT NOT NULL,
    class           TEXT NOT NULL,
    suite_version   TEXT NOT NULL,
    driver_version  TEXT NOT NULL,
    cert_key        TEXT,
    requested_cols  TEXT NOT NULL -- ",4096,8192," (empty: none)
);
CREATE INDEX verification_facts_keys ON verification_facts (kernel_digest, arch, class, cert_key);
CREATE INDEX verification_facts_driver ON verification_facts (arch, verification_id);

CREATE TRIGGER verification_verdicts_immutable BEFORE UPDATE OR DELETE ON verification_verdicts
    FOR EACH ROW EXECUTE FUNCTION kernelize_refuse_change();
CREATE TRIGGER verification_speeds_immutable BEFORE UPDATE OR DELETE ON verification_speeds
    FOR EACH ROW EXECUTE FUNCTION kernelize_refuse_change();
CREATE TRIGGER verification_facts_immutable BEFORE UPDATE OR DELETE ON verification_facts
    FOR EACH ROW EXECUTE FUNCTION kernelize_refuse_change();

-- A counter bumped in every transaction that stores a kernel or a verification: an answer
-- computed at generation n (resolve, the policy list) stays right while it reads n, on every
-- replica (the row lock orders the bumps with the commits).
CREATE TABLE answer_generation (
    id BIGINT PRIMARY KEY CHECK (id = 1),
    n  BIGINT NOT NULL
);
INSERT INTO answer_generation (id, n) VALUES (1, 0);
CREATE FUNCTION kernelize_bump_generation() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE answer_generation SET n = n + 1 WHERE id = 1;
    RETURN NULL;
END;
$$;
CREATE TRIGGER kernels_bump_generation AFTER INSERT ON kernels
    FOR EACH ROW EXECUTE FUNCTION kernelize_bump_generation();
CREATE TRIGGER verifications_bump_generation AFTER INSERT ON verifications
    FOR EACH ROW EXECUTE FUNCTION kernelize_bump_generation();
CREATE TRIGGER verification_facts_bump_generation AFTER INSERT ON verification_facts
    FOR EACH ROW EXECUTE FUNCTION kernelize_bump_generation();

-- The workers /metrics lists, with when each was last heard from, kept on each claim instead of
-- grouping every `job.claimed` audit row on each scrape.
CREATE TABLE workers_seen (
    worker     TEXT PRIMARY KEY,
    first_seen TEXT NOT NULL,
    last_seen  TEXT NOT NULL
);
INSERT INTO workers_seen (worker, first_seen, last_seen)
    SELECT actor, MIN(at), MAX(at) FROM audit_log WHERE action = 'job.claimed' GROUP BY actor;
CREATE INDEX workers_seen_last ON workers_seen (last_seen);
