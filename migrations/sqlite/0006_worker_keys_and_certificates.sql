-- Issue 18: signed verification certificates.
--
-- Workers' ed25519 public keys, registered by an admin (`kernelize worker register`): a report
-- that comes with a certificate is stored only when the certificate verifies against a
-- registered, unrevoked key and binds that report. The certificate is kept with the
-- verification and served with it, so that clients can check the verdict offline.
CREATE TABLE worker_keys (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    name       TEXT NOT NULL UNIQUE,
    public_key TEXT NOT NULL UNIQUE, -- 32 bytes, standard base64
    created_at TEXT NOT NULL,
    revoked_at TEXT
);

ALTER TABLE verifications ADD COLUMN certificate TEXT; -- JSON of a kernel_registry::cert::Certificate
