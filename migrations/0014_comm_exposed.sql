-- Communication under distributed training (docs/ranks.md): comm_ms, kept
-- since the first schema, is the time at least one of the step's
-- collectives was in flight; comm_exposed_ms is the part of the step the
-- compute stream spent waiting on communication, the part a breakdown
-- shows as communication. Nullable without a default: adding it touches no
-- existing row, compressed chunks included.
ALTER TABLE steps ADD COLUMN comm_exposed_ms double precision;
