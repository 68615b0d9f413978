-- The retention job (store/retention.go) deletes GPU samples of no run and
-- host samples by their own time, every hour. Neither table had an index
-- leading with time, so on plain PostgreSQL each pass read the whole
-- table. Samples arrive in time order, which is what a BRIN index needs:
-- a few pages per million rows, and next to nothing for ingest to keep up.
-- On TimescaleDB, chunks already narrow the search; the index is made on
-- each chunk and costs as little there.
CREATE INDEX gpu_samples_time_brin ON gpu_samples USING brin (time);
CREATE INDEX host_samples_time_brin ON host_samples USING brin (time);
