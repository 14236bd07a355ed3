-- /metrics counts audit entries by action (lease expiries) at every scrape: an index keeps
-- that from reading the whole log.
CREATE INDEX audit_log_action ON audit_log (action);
