-- Issue 30: the figures of the GPU a verification ran on that a backward kernel's verdict
-- depends on (eager's column sum for dw is configured from the SM count and the threads per
-- SM), beside the facts, so that a resolve of a backward op can key on them without the report.
-- Filled here from the stored reports (NULL where a report has none); written with each
-- verification from now on (`summary::insert_summary_in`).
ALTER TABLE verification_facts ADD COLUMN sm_count BIGINT;
ALTER TABLE verification_facts ADD COLUMN threads_per_sm BIGINT;
ALTER TABLE verification_facts DISABLE TRIGGER verification_facts_immutable;
UPDATE verification_facts f SET
    sm_count = (v.report_json::json -> 'device' ->> 'sm_count')::bigint,
    threads_per_sm = (v.report_json::json -> 'device' ->> 'threads_per_sm')::bigint
    FROM verifications v WHERE v.id = f.verification_id;
ALTER TABLE verification_facts ENABLE TRIGGER verification_facts_immutable;
