-- Issue 26 (docs/spec.md section 3b): the capability audit of a verification's compiled code,
-- per dtype verdict, as the policy reads it. `capabilities` holds the flags the SQL policy
-- condition tests (`,trap,!clock,`: each capability found, `!` before one the manifest does
-- not declare); `capabilities_json` the audit itself (evidence, declarations) for the lines
-- that say why a policy refuses it. Both NULL: not audited (a verification stored before the
-- audit, or a Python candidate's).
ALTER TABLE verification_verdicts ADD COLUMN capabilities TEXT;
ALTER TABLE verification_verdicts ADD COLUMN capabilities_json TEXT;
