-- Issue 18: re-verification across GPUs.
--
-- A job may be for one architecture (`kernelize verify-request --arch`): only a worker that
-- declares that architecture when it claims gets it. NULL: any architecture (the job queued
-- when a kernel is stored, and width jobs). At most one such job per kernel and architecture
-- is pending at a time.
ALTER TABLE verification_jobs ADD COLUMN arch TEXT;
CREATE UNIQUE INDEX jobs_one_pending_arch ON verification_jobs (kernel_digest, arch)
    WHERE arch IS NOT NULL AND width_cols IS NULL AND state IN ('queued', 'running');

-- Width jobs (queued by /v1/resolve for a width not verified yet) are for the architecture the
-- client asked about from now on: one pending per kernel, width and architecture. Those queued
-- before this migration stay for any architecture.
DROP INDEX jobs_one_pending_width;
CREATE UNIQUE INDEX jobs_one_pending_width ON verification_jobs (kernel_digest, width_cols, COALESCE(arch, ''))
    WHERE width_cols IS NOT NULL AND state IN ('queued', 'running');

-- The driver a verification was measured with (from its report), so that the newest driver
-- seen on an architecture is one indexed read: verdicts measured with another driver than the
-- newest one there are stale. NULL for verifications stored before this migration (their
-- reports still say it).
ALTER TABLE verifications ADD COLUMN driver_version TEXT;
CREATE INDEX verifications_arch ON verifications (arch, id);
