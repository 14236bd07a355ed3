-- kernelize schema (SQLite). Kernel sources, kernels and verification records are immutable.
CREATE TABLE sources (
    digest        TEXT PRIMARY KEY,
    manifest_toml TEXT NOT NULL,
    manifest_json TEXT NOT NULL,
    source        TEXT NOT NULL,
    created_at    TEXT NOT NULL
);

CREATE TABLE kernels (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    name             TEXT NOT NULL,
    version          TEXT NOT NULL,
    digest           TEXT NOT NULL UNIQUE REFERENCES sources(digest),
    op               TEXT NOT NULL,
    semantics        TEXT NOT NULL,
    dtypes           TEXT NOT NULL, -- ",bf16,f32," for filtering
    archs            TEXT NOT NULL, -- ",sm_90," or "" for any
    cols_min         BIGINT NOT NULL,
    cols_max         BIGINT,
    cols_multiple_of BIGINT NOT NULL,
    description      TEXT NOT NULL,
    license          TEXT NOT NULL,
    authors          TEXT NOT NULL, -- JSON array
    origin           TEXT NOT NULL, -- bundled | submitted
    created_at       TEXT NOT NULL,
    UNIQUE (name, version)
);
CREATE INDEX kernels_op ON kernels (op, semantics);

CREATE TABLE verification_jobs (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    kernel_digest    TEXT NOT NULL REFERENCES kernels(digest),
    state            TEXT NOT NULL DEFAULT 'queued', -- queued | running | done | failed
    attempts         BIGINT NOT NULL DEFAULT 0,
    max_attempts     BIGINT NOT NULL,
    worker           TEXT,
    lease_id         TEXT,
    lease_expires_ms BIGINT,
    last_error       TEXT,
    verification_id  BIGINT,
    created_at       TEXT NOT NULL,
    updated_at       TEXT NOT NULL
);
CREATE INDEX jobs_state ON verification_jobs (state, id);

CREATE TABLE verifications (
    id                    INTEGER PRIMARY KEY AUTOINCREMENT,
    kernel_digest         TEXT NOT NULL REFERENCES kernels(digest),
    job_id                BIGINT,
    arch                  TEXT NOT NULL,
    device_name           TEXT NOT NULL,
    exactness_class       TEXT NOT NULL,
    max_ulp               BIGINT NOT NULL,
    max_mismatch_fraction REAL NOT NULL,
    max_abs_diff          REAL NOT NULL,
    deterministic         BIGINT NOT NULL,
    batch_invariant       BIGINT NOT NULL,
    integrity_ok          BIGINT NOT NULL,
    gbps_4096x8192        REAL,
    gbps_32768x4096       REAL,
    report_json           TEXT NOT NULL,
    created_at            TEXT NOT NULL
);
CREATE INDEX verifications_kernel ON verifications (kernel_digest, arch);

CREATE TABLE api_tokens (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    name       TEXT NOT NULL,
    token_hash TEXT NOT NULL UNIQUE,
    scopes     TEXT NOT NULL, -- ",submit,worker,"
    created_at TEXT NOT NULL,
    revoked_at TEXT
);

CREATE TABLE audit_log (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    at      TEXT NOT NULL,
    actor   TEXT NOT NULL,
    action  TEXT NOT NULL,
    subject TEXT NOT NULL,
    detail  TEXT NOT NULL
);

CREATE TRIGGER sources_immutable BEFORE UPDATE ON sources
BEGIN SELECT RAISE(ABORT, 'kernel sources are immutable'); END;
CREATE TRIGGER sources_no_delete BEFORE DELETE ON sources
BEGIN SELECT RAISE(ABORT, 'kernel sources are immutable'); END;
CREATE TRIGGER kernels_immutable BEFORE UPDATE ON kernels
BEGIN SELECT RAISE(ABORT, 'kernels are immutable'); END;
CREATE TRIGGER verifications_immutable BEFORE UPDATE ON verifications
BEGIN SELECT RAISE(ABORT, 'verification records are immutable'); END;
CREATE TRIGGER audit_log_append_only BEFORE UPDATE ON audit_log
BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
