-- Issue 30: the figures of the GPU a verification ran on that a backward kernel's verdict
-- depends on (eager's column sum for dw is configured from the SM count and the threads per
-- SM), beside the facts, so that a resolve of a backward op can key on them without the report.
-- Filled here from the stored reports (NULL where a report has none); written with each
-- verification from now on (`summary::insert_summary_in`).
ALTER TABLE verification_facts ADD COLUMN sm_count INTEGER;
ALTER TABLE verification_facts ADD COLUMN threads_per_sm INTEGER;
DROP TRIGGER verification_facts_immutable;
UPDATE verification_facts SET
    sm_count = (SELECT json_extract(v.report_json, '$.device.sm_count') FROM verifications v
                WHERE v.id = verification_facts.verification_id),
    threads_per_sm = (SELECT json_extract(v.report_json, '$.device.threads_per_sm') FROM verifications v
                      WHERE v.id = verification_facts.verification_id);
CREATE TRIGGER verification_facts_immutable BEFORE UPDATE ON verification_facts
BEGIN SELECT RAISE(ABORT, 'verification facts are immutable'); END;
