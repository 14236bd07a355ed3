-- Issue 17: workers that cannot forge verdicts; tokens that expire and can be revoked.
--
-- A job remembers which token claimed it (its id, never the secret): heartbeat, report and
-- fail are accepted only from that token, with the lease. Jobs running at this upgrade were
-- claimed before claims were recorded: they go back to the queue (the interrupted attempt does
-- not count), and their workers' next heartbeat or report is answered 409 (lease lost).
ALTER TABLE verification_jobs ADD COLUMN claim_token_id BIGINT REFERENCES api_tokens(id);

INSERT INTO audit_log (at, actor, action, subject, detail)
    SELECT strftime('%Y-%m-%dT%H:%M:%SZ', 'now'), 'system', 'job.requeued', kernel_digest,
           '{"job_id": ' || id || ', "reason": "running when migration 0004 recorded claim tokens: claimed again by a token"}'
    FROM verification_jobs WHERE state = 'running';
UPDATE verification_jobs SET
    state = 'queued',
    attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END,
    lease_id = NULL,
    lease_expires_ms = NULL,
    last_error = 're-queued by the upgrade that binds jobs to the token that claims them (migration 0004)',
    updated_at = strftime('%Y-%m-%dT%H:%M:%SZ', 'now')
WHERE state = 'running';

-- Token expiry and last use, in milliseconds since the Unix epoch (NULL: never expires /
-- never used). Tokens created before this upgrade expire 90 days after it, the default
-- lifetime of a new token: `kernelize token list` shows them, `kernelize token create` makes
-- their successors.
ALTER TABLE api_tokens ADD COLUMN expires_ms BIGINT;
ALTER TABLE api_tokens ADD COLUMN last_used_ms BIGINT;
UPDATE api_tokens SET expires_ms = CAST(strftime('%s', 'now') AS BIGINT) * 1000 + 7776000000
    WHERE revoked_at IS NULL;
CREATE INDEX api_tokens_name ON api_tokens (name);
