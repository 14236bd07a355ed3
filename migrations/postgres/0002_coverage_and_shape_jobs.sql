-- What each verification covered (issue 13): per dtype and row length, the row counts its
-- cases ran. Filled when a verification is stored; rows of verifications stored before this
-- migration are computed from their report JSON by `Store::migrate` (SQL cannot read it).
CREATE TABLE verification_coverage (
    verification_id BIGINT NOT NULL REFERENCES verifications(id),
    dtype           TEXT NOT NULL,
    cols            BIGINT NOT NULL,
    rows_min        BIGINT NOT NULL,
    rows_max        BIGINT NOT NULL,
    row_counts      TEXT NOT NULL, -- ",1,2,64," every row count that ran
    PRIMARY KEY (verification_id, dtype, cols)
);

-- Shapes a job verifies besides the suite (JSON list of {cols, rows_min, rows_max}; '[]' =
-- the suite alone). `width_cols` is set on jobs queued by /v1/resolve for one unverified
-- width: at most one such job per (kernel, width) is pending at a time.
ALTER TABLE verification_jobs ADD COLUMN shapes TEXT NOT NULL DEFAULT '[]';
ALTER TABLE verification_jobs ADD COLUMN width_cols BIGINT;
CREATE UNIQUE INDEX jobs_one_pending_width ON verification_jobs (kernel_digest, width_cols)
    WHERE width_cols IS NOT NULL AND state IN ('queued', 'running');
CREATE INDEX jobs_pending_width ON verification_jobs (width_cols, state);

CREATE TRIGGER verification_coverage_immutable BEFORE UPDATE ON verification_coverage
    FOR EACH ROW EXECUTE FUNCTION kernelize_refuse_change();
