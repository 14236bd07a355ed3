-- Issue 27: when the GPU measured a verification, not when this hub stored it. `verified_at`
-- is the report's own `started_at` (what a resolve answer's `verified_at` says); `imported_at`
-- is when this hub imported a verification no job of its own produced (a certificate measured
-- elsewhere, e.g. the bundled ones), NULL for a report of this hub's worker; `created_at` stays
-- when it was stored. Beside the facts, so that the dashboard's matrix and field pages read the
-- measured time without the report. Filled here from the stored reports; written with each
-- verification from now on (`newest::insert_summary_in`).
ALTER TABLE verification_facts ADD COLUMN verified_at TEXT NOT NULL DEFAULT '';
ALTER TABLE verification_facts ADD COLUMN imported_at TEXT;
DROP TRIGGER verification_facts_immutable;
UPDATE verification_facts SET
    verified_at = COALESCE(
        (SELECT json_extract(v.report_json, '$.started_at') FROM verifications v
         WHERE v.id = verification_facts.verification_id),
        created_at),
    imported_at = (SELECT v.created_at FROM verifications v
                   WHERE v.id = verification_facts.verification_id AND v.job_id IS NULL);
CREATE TRIGGER verification_facts_immutable BEFORE UPDATE ON verification_facts
BEGIN SELECT RAISE(ABORT, 'verification facts are immutable'); END;
