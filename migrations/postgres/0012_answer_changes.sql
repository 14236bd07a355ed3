-- Issue 17: what each answer generation changed, so that a reader who holds the verdicts in
-- memory (`kernel_store::VerdictIndex`) reads the new kernels and verifications since the
-- generation it saw instead of reading everything again. Written by the triggers that bump the
-- generation, in the same transaction, with the generation that transaction made: a reader
-- that sees generation g sees every change up to g (the generation row's lock orders the bumps
-- with the commits).
CREATE TABLE answer_changes (
    n               BIGINT NOT NULL,
    kernel_id       BIGINT,
    verification_id BIGINT
);
CREATE INDEX answer_changes_n ON answer_changes (n);

CREATE FUNCTION kernelize_log_kernel() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE g BIGINT;
BEGIN
    UPDATE answer_generation SET n = n + 1 WHERE id = 1 RETURNING n INTO g;
    INSERT INTO answer_changes (n, kernel_id) VALUES (g, NEW.id);
    RETURN NULL;
END;
$$;
CREATE FUNCTION kernelize_log_verification() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE g BIGINT;
BEGIN
    UPDATE answer_generation SET n = n + 1 WHERE id = 1 RETURNING n INTO g;
    INSERT INTO answer_changes (n, verification_id) VALUES (g, NEW.verification_id);
    RETURN NULL;
END;
$$;
DROP TRIGGER kernels_bump_generation ON kernels;
CREATE TRIGGER kernels_bump_generation AFTER INSERT ON kernels
    FOR EACH ROW EXECUTE FUNCTION kernelize_log_kernel();
DROP TRIGGER verification_facts_bump_generation ON verification_facts;
CREATE TRIGGER verification_facts_bump_generation AFTER INSERT ON verification_facts
    FOR EACH ROW EXECUTE FUNCTION kernelize_log_verification();
