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
CREATE TRIGGER jobs_keep_workers_seen AFTER UPDATE OF updated_at ON verification_jobs
WHEN NEW.worker IS NOT NULL
BEGIN
    INSERT INTO workers_seen (worker, first_seen, last_seen)
    VALUES (NEW.worker, NEW.updated_at, NEW.updated_at)
    ON CONFLICT (worker) DO UPDATE SET last_seen = excluded.last_seen
    WHERE excluded.last_seen > workers_seen.last_seen;
END;

-- A verification's device and time beside its facts: resolve reads the newest verdicts of a
-- whole op group, and in SQLite a column stored after the report (`created_at`) is reached only
-- by walking the report's overflow pages.
ALTER TABLE verification_facts ADD COLUMN device_name TEXT NOT NULL DEFAULT '';
ALTER TABLE verification_facts ADD COLUMN created_at TEXT NOT NULL DEFAULT '';
DROP TRIGGER verification_facts_immutable;
UPDATE verification_facts SET
    device_name = (SELECT v.device_name FROM verifications v WHERE v.id = verification_facts.verification_id),
    created_at = (SELECT v.created_at FROM verifications v WHERE v.id = verification_facts.verification_id);
CREATE TRIGGER verification_facts_immutable BEFORE UPDATE ON verification_facts
BEGIN SELECT RAISE(ABORT, 'verification facts are immutable'); END;
