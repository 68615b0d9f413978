-- When a rollup marker was set, so that a background refresher can serve
-- the runs that have waited longest first. Ingest's upsert of an existing
-- marker keeps its time: the wait counts from the first unrefreshed write.
ALTER TABLE rollup_dirty ADD COLUMN marked_at timestamptz NOT NULL DEFAULT now();
