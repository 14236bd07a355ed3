-- Issue 26: a fresh random nonce with every claim of a job, handed to the claimant with its
-- lease. A worker's certificate (format kernelize-certificate/2) names the job id and this
-- nonce, so a valid certificate posted again for another job, or for a later claim of the same
-- job, is refused. Cleared when the claim ends without a report (fail, requeue).
ALTER TABLE verification_jobs ADD COLUMN claim_nonce TEXT;
