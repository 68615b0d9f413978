package store

import (
	"context"
	"fmt"
	"sort"
	"time"
)

// The hosts a run ran on and their CPU use, as compare reads them (see
// docs/compare.md): each read takes many runs, or many sets of hosts,
// each over its own time range, in one statement.

// RunWindow is a run and a time range of it.
type RunWindow struct {
	RunID    string
	From, To time.Time
}

// RunHosts returns the hosts a run's processes ran on, sorted: those of
// the GPU samples attributed to it and those whose host samples in
// [from, to] list one of its processes (host samples have no run index:
// the time range bounds the scan).
func (s *Store) RunHosts(ctx context.Context, runID string, from, to time.Time) ([]string, error) {
	m, err := s.RunHostsOf(ctx, []RunWindow{{RunID: runID, From: from, To: to}})
	return m[runID], err
}

// RunHostsOf is [Store.RunHosts] of each run of runs over its own time
// range, in one statement; a run without hosts has no entry.
func (s *Store) RunHostsOf(ctx context.Context, runs []RunWindow) (map[string][]string, error) {
	ids := make([]string, len(runs))
	froms, tos := make([]time.Time, len(runs)), make([]time.Time, len(runs))
	for i, r := range runs {
		ids[i], froms[i], tos[i] = r.RunID, r.From, r.To
	}
	rows, err := s.pool.Query(ctx, `
		SELECT w.run_id, x.host FROM unnest($1::text[], $2::timestamptz[], $3::timestamptz[]) AS w(run_id, lo, hi)
		CROSS JOIN LATERAL (
			WITH RECURSIVE g AS (
				(SELECT host FROM gpu_minutes WHERE run_id = w.run_id ORDER BY host LIMIT 1)
				UNION ALL
				SELECT (SELECT m.host FROM gpu_minutes m WHERE m.run_id = w.run_id AND m.host > g.host ORDER BY m.host LIMIT 1)
				FROM g WHERE g.host IS NOT NULL
			)
			SELECT host FROM g WHERE host IS NOT NULL
			UNION
			SELECT h.host FROM host_samples h
			WHERE h.time >= w.lo AND h.time <= w.hi AND jsonb_typeof(h.processes) = 'array'
			  AND h.processes @> jsonb_build_array(jsonb_build_object('run_id', w.run_id))
		) x`, ids, froms, tos)
	if err != nil {
		return nil, fmt.Errorf("store: hosts of %s: %w", runsWhat(ids), err)
	}
	defer rows.Close()
	out := map[string][]string{}
	for rows.Next() {
		var id, host string
		if err := rows.Scan(&id, &host); err != nil {
			return nil, fmt.Errorf("store: hosts of %s: %w", runsWhat(ids), err)
		}
		out[id] = append(out[id], host)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: hosts of %s: %w", runsWhat(ids), err)
	}
	for _, hosts := range out {
		sort.Strings(hosts)
	}
	return out, nil
}

// HostCPUStats is the whole-host CPU use of some hosts over a time range.
type HostCPUStats struct {
	// MeanPct is the mean over the hosts of each host's mean CPU
	// utilisation (0..100, all of its CPUs), or nil without samples.
	MeanPct *float64
	Samples int64
}

// HostsWindow is a set of hosts and a time range, named by Key.
type HostsWindow struct {
	Key      string
	Hosts    []string
	From, To time.Time
}

// HostCPU averages the CPU utilisation of the host samples of hosts in
// [from, to] (whole minutes from host_minutes, the edges from the
// samples): each host's samples are averaged, then the hosts.
func (s *Store) HostCPU(ctx context.Context, hosts []string, from, to time.Time) (*HostCPUStats, error) {
	m, err := s.HostCPUOf(ctx, []HostsWindow{{Hosts: hosts, From: from, To: to}})
	if err != nil {
		return nil, err
	}
	return m[""], nil
}

// HostCPUOf is [Store.HostCPU] of each of sets, by key, in one
// statement. Every key has an entry, zero for hosts without samples.
func (s *Store) HostCPUOf(ctx context.Context, sets []HostsWindow) (map[string]*HostCPUStats, error) {
	out := make(map[string]*HostCPUStats, len(sets))
	var keys, hostKeys, hosts []string
	var minLo, minHi, lo1, hi1, lo2, hi2 []*time.Time
	for _, w := range sets {
		out[w.Key] = &HostCPUStats{}
		if len(w.Hosts) == 0 {
			continue
		}
		m := minuteSplit(w.From, w.To)
		keys = append(keys, w.Key)
		minLo, minHi, lo1, hi1, lo2, hi2 = append(minLo, m.minLo), append(minHi, m.minHi), append(lo1, m.rawLo1), append(hi1, m.rawHi1),
			append(lo2, m.rawLo2), append(hi2, m.rawHi2)
		for _, h := range w.Hosts {
			hostKeys, hosts = append(hostKeys, w.Key), append(hosts, h)
		}
	}
	if len(keys) == 0 {
		return out, nil
	}
	rows, err := s.pool.Query(ctx, `
		WITH w AS (
			SELECT * FROM unnest($1::text[], $2::timestamptz[], $3::timestamptz[], $4::timestamptz[], $5::timestamptz[],
				$6::timestamptz[], $7::timestamptz[]) AS w(k, min_lo, min_hi, lo1, hi1, lo2, hi2)
		), kh AS (
			SELECT DISTINCT k, host FROM unnest($8::text[], $9::text[]) AS kh(k, host)
		), u AS (
			SELECT kh.k, kh.host, m.cpu_sum AS cs, m.cpu_n AS cn FROM kh JOIN w USING (k)
			JOIN host_minutes m ON m.host = kh.host AND w.min_lo IS NOT NULL AND m.minute >= w.min_lo AND m.minute < w.min_hi AND m.cpu_n > 0
			UNION ALL
			SELECT kh.k, kh.host, h.cpu_util_pct, 1 FROM kh JOIN w USING (k)
			JOIN host_samples h ON h.host = kh.host AND h.cpu_util_pct IS NOT NULL AND (
			     (w.lo1 IS NOT NULL AND h.time >= w.lo1 AND h.time < w.hi1)
			  OR (w.lo2 IS NOT NULL AND h.time >= w.lo2 AND h.time <= w.hi2))
		)
		SELECT k, avg(c), coalesce(sum(n), 0)::bigint FROM (
			SELECT k, host, sum(cs) / sum(cn) AS c, sum(cn) AS n FROM u GROUP BY k, host
		) x GROUP BY k`, keys, minLo, minHi, lo1, hi1, lo2, hi2, hostKeys, hosts)
	if err != nil {
		return nil, fmt.Errorf("store: host cpu of %d sets of hosts: %w", len(keys), err)
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		var h HostCPUStats
		if err := rows.Scan(&k, &h.MeanPct, &h.Samples); err != nil {
			return nil, fmt.Errorf("store: host cpu of %d sets of hosts: %w", len(keys), err)
		}
		out[k] = &h
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: host cpu of %d sets of hosts: %w", len(keys), err)
	}
	return out, nil
}
