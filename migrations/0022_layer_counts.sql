-- A layer rollup's counts of one pass say how many of its rows timed each
-- layer. Where every row timed every layer (nearly every bucket) they are
-- the bucket's rows, once per layer: they were half of its bytes. Such
-- counts are now stored NULL and read as the rows, once per layer of the
-- sums. Buckets written before keep their counts, which mean the same;
-- the next refresh of a bucket writes it the new way.
ALTER TABLE layer_rollups
    ALTER COLUMN fwd_counts DROP NOT NULL,
    ALTER COLUMN bwd_counts DROP NOT NULL;
