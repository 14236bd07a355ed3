-- Issue 16: Python candidates (SPEC 2b). What executes a kernel's source, from its manifest:
-- 'cuda' (every kernel stored before this migration) or 'python'. Indexed columns as for op and
-- semantics, so that lists, the dashboard and resolve say which runtime a kernel needs without
-- parsing its manifest.
ALTER TABLE kernels ADD COLUMN runtime TEXT NOT NULL DEFAULT 'cuda';
