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

DROP TRIGGER kernels_bump_generation;
CREATE TRIGGER kernels_bump_generation AFTER INSERT ON kernels
BEGIN
    UPDATE answer_generation SET n = n + 1 WHERE id = 1;
    INSERT INTO answer_changes (n, kernel_id) SELECT n, NEW.id FROM answer_generation WHERE id = 1;
END;
DROP TRIGGER verification_facts_bump_generation;
CREATE TRIGGER verification_facts_bump_generation AFTER INSERT ON verification_facts
BEGIN
    UPDATE answer_generation SET n = n + 1 WHERE id = 1;
    INSERT INTO answer_changes (n, verification_id)
        SELECT n, NEW.verification_id FROM answer_generation WHERE id = 1;
END;
