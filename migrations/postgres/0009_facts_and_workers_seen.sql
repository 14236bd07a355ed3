-- Issue 17: /metrics lists workers from `workers_seen` (migration 0008) instead of grouping every
-- `job.claimed` audit row and every job on each scrape. A worker is heard from when it claims a
-- job and whenever a job it holds or held is stamped (a heartbeat, report or failure): a
-- trigger keeps its newest stamp. Filled here from both, as /metrics read them before.
DELETE FROM workers_seen;
INSERT INTO workers_seen (worker, first_seen, last_seen)
    SELECT worker, MIN(seen), MAX(seen) FROM (
        SELECT actor AS worker, at AS seen FROM audit_log WHERE action = 'job.claimed'
        UNION ALL
        SELECT worker, updated_at AS seen FROM verification_jobs WHERE worker IS NOT NULL
    ) w GROUP BY worker;
CREATE FUNCTION kernelize_keep_workers_seen() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO workers_seen (worker, first_seen, last_seen)
    VALUES (NEW.worker, NEW.updated_at, NEW.updated_at)
    ON CONFLICT (worker) DO UPDATE SET last_seen = excluded.last_seen
    WHERE excluded.last_seen > workers_seen.last_seen;
    RETURN NULL;
END;
$$;
CREATE TRIGGER jobs_keep_workers_seen AFTER UPDATE OF updated_at ON verification_jobs
    FOR EACH ROW WHEN (NEW.worker IS NOT NULL) EXECUTE FUNCTION kernelize_keep_workers_seen();

-- A verification's device and time beside its facts: resolve reads the newest verdicts of a
-- whole op group without touching the verification rows (as on SQLite, where a column stored
-- after the report is reached only by walking the report's overflow pages).
ALTER TABLE verification_facts ADD COLUMN device_name TEXT NOT NULL DEFAULT '';
ALTER TABLE verification_facts ADD COLUMN created_at TEXT NOT NULL DEFAULT '';
ALTER TABLE verification_facts DISABLE TRIGGER verification_facts_immutable;
UPDATE verification_facts f SET device_name = v.device_name, created_at = v.created_at
    FROM verifications v WHERE v.id = f.verification_id;
ALTER TABLE verification_facts ENABLE TRIGGER verification_facts_immutable;
