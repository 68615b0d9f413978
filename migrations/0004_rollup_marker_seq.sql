-- A version on each rollup marker. Ingest bumps it whenever it writes into
-- the marker's block again; the refresher reads markers without locking
-- them, recomputes, and deletes only the markers whose version it read. So
-- a refresh never makes ingest wait for it, and a write that lands during
-- a refresh keeps its marker for the next one.
CREATE SEQUENCE rollup_dirty_seq;
ALTER TABLE rollup_dirty ADD COLUMN seq bigint NOT NULL DEFAULT nextval('rollup_dirty_seq');
