-- Issue 26: a CUDA kernel's verification stored before the capability audit has no audit, and
-- what its compiled code can do is unknown; every policy now refuses it, as an audit that could
-- not read a module, until the kernel is verified again (`VerificationReport::audit`,
-- `CapabilityReport::before_audit`: the same flags and JSON, which a kernel-store test checks
-- against this file). Only rows whose report has no audit; Python candidates' rows (their
-- reports carry `python`) stay NULL: not
-- audited, refused only by a policy with `audited`. The reports and certificates are unchanged.
DROP TRIGGER verification_verdicts_immutable;
UPDATE verification_verdicts SET
    capabilities = ',!unaudited,',
    capabilities_json = '{"audited":false,"found":[],"declared":[],"notes":["the verification was made before the capability audit existed, so nothing of its compiled code was read; verify the kernel again (`kernelize verify-request` on a hub, `kernelize verify` locally) to audit it"]}'
WHERE capabilities IS NULL AND capabilities_json IS NULL
    AND verification_id IN (SELECT v.id FROM verifications v
                            WHERE json_extract(v.report_json, '$.python') IS NULL
                              AND json_extract(v.report_json, '$.capabilities') IS NULL);
CREATE TRIGGER verification_verdicts_immutable BEFORE UPDATE ON verification_verdicts
BEGIN SELECT RAISE(ABORT, 'verification verdicts are immutable'); END;
