-- A GPU's minute rollups (gpu_device_minutes) are written once its minute
-- is over, not with every batch of its samples: each batch rewrote the
-- rows of its minutes (a row of a hundred columns for every GPU about
-- once a second), so that a table of 16 MB of live rows took 130 to 200 MB
-- with its dead ones after a load of 1,024 GPUs (docs/scale.md).
--
-- closed_until is the first minute of a GPU whose samples its minute rows
-- do not hold yet: below it, gpu_device_minutes holds every sample written
-- (a sample that comes late is added to its row as it is written); from it
-- on, readers take the samples (store/samples_gpu_close.go). The rollup
-- refresher moves it on, a host at a time, writing the rows of the minutes
-- it passes from their samples.
CREATE TABLE gpu_minute_marks (
    host         text NOT NULL,
    gpu          integer NOT NULL,
    closed_until timestamptz NOT NULL,
    PRIMARY KEY (host, gpu)
);

-- Until now every sample was added to its minute's row as it was written:
-- the rows hold every minute so far. The current minute's may be short of
-- what an older server writes meanwhile, so it is written again from its
-- samples when it is closed.
INSERT INTO gpu_minute_marks (host, gpu, closed_until)
SELECT DISTINCT host, gpu, date_trunc('minute', now()) FROM gpu_device_minutes;
