-- Issue 18: re-verification across GPUs.
--
-- A job may be for one architecture (`kernelize verify-request --arch`): only a worker that
-- declares that architecture when it claims gets it. NULL: any architecture (the job queued
-- when a kernel is stored, and width jobs). At most one such job per kernel and architecture
-- is pending at a time.
ALTER TABLE verification_jobs ADD COLUMN arch TEXT;
CREATE UNIQUE INDEX jobs_one_pending_arch ON verification_jobs (kernel_digest, arch)
    WHERE arch IS NOT NULL AND state IN ('queued', 'running');

-- The driver a verification was measured with (from its report), so that the newest driver
-- seen on an architecture is one indexed read: verdicts measured with another driver than the
-- newest one there are stale. NULL for verifications stored before this migration (their
-- reports still say it).
ALTER TABLE verifications ADD COLUMN driver_version TEXT;
CREATE INDEX verifications_arch ON verifications (arch, id);
