-- Per-minute sums of the samples, kept by ingest in the transaction that
-- writes the samples (store/write_merge.go), so that a run's GPU figures,
-- its hosts and their CPU use read a row a host and minute instead of
-- every sample (docs/scale.md). Sums and counts add up exactly; a NaN
-- makes its sum NaN as it makes avg() over the samples NaN.
CREATE TABLE gpu_minutes (
    run_id    text NOT NULL,
    host      text NOT NULL,
    minute    timestamptz NOT NULL,
    samples   bigint NOT NULL,
    mem_n     bigint NOT NULL,
    mem_sum   double precision,
    mem_max   double precision,
    util_n    bigint NOT NULL,
    util_sum  double precision,
    util_min  double precision,
    total_max double precision,
    PRIMARY KEY (run_id, host, minute)
);

CREATE TABLE host_minutes (
    host    text NOT NULL,
    minute  timestamptz NOT NULL,
    cpu_n   bigint NOT NULL,
    cpu_sum double precision,
    PRIMARY KEY (host, minute)
);
CREATE INDEX host_minutes_minute ON host_minutes (minute);

INSERT INTO gpu_minutes (run_id, host, minute, samples, mem_n, mem_sum, mem_max, util_n, util_sum, util_min, total_max)
SELECT run_id, host, date_trunc('minute', time), count(*), count(mem_used_bytes), sum(mem_used_bytes), max(mem_used_bytes),
       count(util_pct), sum(util_pct), min(util_pct), max(mem_total_bytes)
FROM gpu_samples WHERE run_id <> '' GROUP BY 1, 2, 3;

INSERT INTO host_minutes (host, minute, cpu_n, cpu_sum)
SELECT host, date_trunc('minute', time), count(cpu_util_pct), sum(cpu_util_pct)
FROM host_samples GROUP BY 1, 2;

-- Where each rank of a run runs: the host of its newest GPU sample, kept
-- by the same statement, one row a rank.
CREATE TABLE rank_hosts (
    run_id text NOT NULL,
    rank   integer NOT NULL,
    host   text NOT NULL,
    time   timestamptz NOT NULL,
    PRIMARY KEY (run_id, rank)
);

INSERT INTO rank_hosts (run_id, rank, host, time)
SELECT DISTINCT ON (run_id, rank) run_id, rank, host, time FROM gpu_samples
WHERE run_id <> '' AND rank IS NOT NULL ORDER BY run_id, rank, time DESC;
