-- Issue 17: kernels in the order every list pages them (op, semantics, name, id), so that a page
-- is read in index order and stops at its last row instead of sorting every kernel.
CREATE INDEX kernels_list_order ON kernels (op, semantics, name, id);
