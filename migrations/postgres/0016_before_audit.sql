-- Issue 26: a CUDA kernel's verification stored before the capability audit has no audit, and
-- what its compiled code can do is unknown; every policy now refuses it, as an audit that could
-- not read a module, until the kernel is verified again (`VerificationReport::audit`,
-- `CapabilityReport::before_audit`: the same flags and JSON, which a kernel-store test checks
-- against this file). Only rows whose report has no audit; Python candidates' rows (their
-- reports carry `python`) stay NULL: not
-- audited, refused only by a policy with `audited`. The reports and certificates are unchanged.
ALTER TABLE verification_verdicts DISABLE TRIGGER verification_verdicts_immutable;
UPDATE verification_verdicts d SET
    capabilities = ',!unaudited,',
    capabilities_json = '{"audited":false,"found":[],"declared":[],"notes":["the verification was made before the capability audit existed, so nothing of its compiled code was read; verify the kernel again (`kernelize verify-request` on a hub, `kernelize verify` locally) to audit it"]}'
    FROM verifications v
    WHERE v.id = d.verification_id AND d.capabilities IS NULL AND d.capabilities_json IS NULL
        AND (v.report_json::json ->> 'python') IS NULL
        AND (v.report_json::json ->> 'capabilities') IS NULL;
ALTER TABLE verification_verdicts ENABLE TRIGGER verification_verdicts_immutable;
