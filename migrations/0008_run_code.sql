-- The code that produced a run: the entry script's source and the diff of
-- uncommitted changes (api.RunCode), up to 512 KiB each. Its own column,
-- so that listing runs never reads it; GET /api/v1/runs/{id}/code does.
ALTER TABLE runs ADD COLUMN code jsonb;
