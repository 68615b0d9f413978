package store

// The host_samples table and its per-minute sums, host_minutes.

var hostCols = []string{"time", "host", "cpu_util_pct", "mem_used_bytes", "mem_total_bytes", "load1", "processes"}

func (b *batchPlan) hostRow(i int, r []any) []any {
	h := b.hosts[i]
	return append(r, h.Time.Time, h.Host, f(h.CPUUtilPct), f(h.MemUsedBytes), f(h.MemTotalBytes), f(h.Load1),
		jsonValue(h.Processes, len(h.Processes) == 0))
}

const mergeHost = `WITH ins AS (
	INSERT INTO host_samples SELECT * FROM tmp_host_samples ORDER BY host, time ON CONFLICT DO NOTHING
	RETURNING host, time, cpu_util_pct
), m AS (
	INSERT INTO host_minutes AS m (host, minute, cpu_n, cpu_sum)
	SELECT host, date_trunc('minute', time), count(cpu_util_pct), sum(cpu_util_pct)
	FROM ins GROUP BY 1, 2 ORDER BY 1, 2
	ON CONFLICT (host, minute) DO UPDATE SET cpu_n = m.cpu_n + EXCLUDED.cpu_n,
		cpu_sum = coalesce(m.cpu_sum + EXCLUDED.cpu_sum, m.cpu_sum, EXCLUDED.cpu_sum)
)
SELECT count(*) FROM ins`
