package store

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/jackc/pgx/v5"
)

// The width-100 rollups of SyncMetrics, folded in Go from a binary stream
// of the raw rows. They are the figures of GET /runs/{id}/ranks
// (ranks_series.go: completeSteps, clockOffsets and lateness) with clock
// offsets estimated block by block, computed as PostgreSQL computes that
// SQL: NaN above every number and equal to itself, NULLs skipped by the
// aggregates, the median by percentile_cont. As SQL they were several
// window sorts over every rank's rows of a block, about ten seconds a
// block at 1,024 ranks on two cores, the larger part of a refresh; here
// the rows are read once by each rank's index range and folded in tens
// of milliseconds.

// syncRow is the newest row of one rank and step.
type syncRow struct {
	rank   int32
	step   int64
	time   int64 // microseconds since the PostgreSQL epoch
	a, w   float64
	hasA   bool // sync_ns was set: a is the arrival in ms since the Unix epoch
	hasW   bool // sync_wait_ms was set: w is the wait in the collective
	stepMS float64
	hasMS  bool
}

// syncSteps is what refreshSyncBlocks reads: each rank's rows of the
// blocks, by the rank's own index range, so that the plan needs no
// statistics of steps.
const syncSteps = `
SELECT s.rank, s.time, s.step, s.sync_ns, s.sync_wait_ms, s.step_ms
FROM unnest($2::int[], $3::bigint[], $4::bigint[]) AS d(rank, lo, hi) CROSS JOIN LATERAL (
	SELECT rank, time, step, sync_ns, sync_wait_ms, step_ms FROM steps
	WHERE run_id = $1 AND rank = d.rank AND step >= d.lo * 100 AND step < (d.hi + 1) * 100
	OFFSET 0
) s`

// refreshSyncBlocks writes the width-100 rollups of SyncMetrics of every
// rank of ranks (every rank of the run) in blocks (sorted, distinct);
// the old ones must have been deleted.
func refreshSyncBlocks(ctx context.Context, tx pgx.Tx, runID string, blocks []int64, ranks []int32) error {
	var sr []int32
	var lo, hi []int64
	for _, r := range ranks {
		for i, b := range blocks {
			if i > 0 && b == blocks[i-1]+1 {
				hi[len(hi)-1] = b
				continue
			}
			sr, lo, hi = append(sr, r), append(lo, b), append(hi, b)
		}
	}
	rows, err := tx.Query(ctx, syncSteps, runID, sr, lo, hi)
	if err != nil {
		return fmt.Errorf("read synchronisation fields: %w", err)
	}
	in, err := readSyncRows(rows)
	if err != nil {
		return fmt.Errorf("read synchronisation fields: %w", err)
	}
	out := foldSync(runID, in, len(ranks))
	if err := copySets(ctx, tx, out); err != nil {
		return fmt.Errorf("write synchronisation rollups: %w", err)
	}
	return nil
}

func readSyncRows(rows pgx.Rows) ([]syncRow, error) {
	defer rows.Close()
	if err := requireBinary(rows); err != nil {
		return nil, err
	}
	var out []syncRow
	for rows.Next() {
		v := rows.RawValues()
		rank, tm, step, err := rawRowHead(v)
		if err != nil {
			return nil, err
		}
		r := syncRow{rank: rank, step: step, time: tm}
		if v[3] != nil {
			ns, err := rawInt8(v[3])
			if err != nil {
				return nil, err
			}
			r.a, r.hasA = float64(ns)/1e6, true
		}
		if r.w, r.hasW, err = rawFloat8(v[4]); err != nil {
			return nil, err
		}
		if r.stepMS, r.hasMS, err = rawFloat8(v[5]); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// rawFloat8 decodes a nullable float8.
func rawFloat8(b []byte) (float64, bool, error) {
	if b == nil {
		return 0, false, nil
	}
	x, err := rawInt8(b)
	return math.Float64frombits(uint64(x)), err == nil, err
}

// pgMin and pgMax order as PostgreSQL's float8 does (pgLess).
func pgMin(a, b float64) float64 {
	if pgLess(b, a) {
		return b
	}
	return a
}

func pgMax(a, b float64) float64 {
	if pgLess(a, b) {
		return b
	}
	return a
}

// pgEqual is float8 equality as PostgreSQL has it: NaN equals NaN.
func pgEqual(a, b float64) bool { return a == b || (math.IsNaN(a) && math.IsNaN(b)) }

// median is percentile_cont(0.5) of v (sorted here as PostgreSQL sorts).
func median(v []float64) float64 {
	slices.SortFunc(v, func(a, b float64) int {
		switch {
		case pgLess(a, b):
			return -1
		case pgLess(b, a):
			return 1
		}
		return 0
	})
	pos := 0.5 * float64(len(v)-1)
	i, j := int(math.Floor(pos)), int(math.Ceil(pos))
	if i == j {
		return v[i]
	}
	return v[i] + (pos-float64(i))*(v[j]-v[i])
}

// syncBucket accumulates one rank's block.
type syncBucket struct {
	rank             int32
	block            int64
	firstStep        int64
	firstTime, lastT int64
	m                [4]metricAcc // in SyncMetrics order
}

// foldSync computes the width-100 sets of SyncMetrics from rows of nRanks
// ranks (each rank and step at least once, any order).
func foldSync(runID string, rows []syncRow, nRanks int) [][]any {
	// The newest row of each rank and step, by step then rank.
	slices.SortFunc(rows, func(x, y syncRow) int {
		return cmp.Or(cmp.Compare(x.step, y.step), cmp.Compare(x.rank, y.rank), cmp.Compare(y.time, x.time))
	})
	rows = slices.CompactFunc(rows, func(x, y syncRow) bool { return x.step == y.step && x.rank == y.rank })
	// The steps every rank reported (at least two), as [start, end) of rows.
	type span struct {
		start, end int
		na, nw     int
	}
	var steps []span
	for i := 0; i < len(rows); {
		j, na, nw := i, 0, 0
		for ; j < len(rows) && rows[j].step == rows[i].step; j++ {
			if rows[j].hasA {
				na++
			}
			if rows[j].hasW {
				nw++
			}
		}
		if n := j - i; n == nRanks && n >= 2 {
			steps = append(steps, span{i, j, na, nw})
		}
		i = j
	}
	// Clock offsets per rank and block: the median over the steps with
	// every arrival and wait of the release (a + w) less the step's
	// earliest.
	type rb struct {
		rank  int32
		block int64
	}
	rels := map[rb][]float64{}
	for _, s := range steps {
		n := s.end - s.start
		if s.na != n || s.nw != n {
			continue
		}
		first := rows[s.start].a + rows[s.start].w
		for _, r := range rows[s.start:s.end] {
			first = pgMin(first, r.a+r.w)
		}
		for _, r := range rows[s.start:s.end] {
			k := rb{r.rank, r.step / 100}
			rels[k] = append(rels[k], (r.a+r.w)-first)
		}
	}
	offs := make(map[rb]float64, len(rels))
	for k, v := range rels {
		offs[k] = median(v)
	}
	buckets := map[rb]*syncBucket{}
	late := make([]float64, 0, nRanks)
	has := make([]bool, 0, nRanks)
	for _, s := range steps {
		rs := rows[s.start:s.end]
		n := len(rs)
		late, has = late[:0], has[:0]
		var minV, maxW, minW float64
		for i, r := range rs {
			if s.na == n {
				v := r.a - offs[rb{r.rank, r.step / 100}]
				if i == 0 {
					minV = v
				}
				minV = pgMin(minV, v)
			}
			if s.nw == n {
				if i == 0 {
					maxW, minW = r.w, r.w
				}
				maxW, minW = pgMax(maxW, r.w), pgMin(minW, r.w)
			}
		}
		latest, anyLate := 0.0, false
		for _, r := range rs {
			var l float64
			ok := true
			switch {
			case s.na == n:
				l = (r.a - offs[rb{r.rank, r.step / 100}]) - minV
			case s.nw == n:
				l = maxW - r.w
			default:
				ok = false
			}
			late, has = append(late, l), append(has, ok)
			if ok {
				if !anyLate {
					latest = l
				}
				latest, anyLate = pgMax(latest, l), true
			}
		}
		for i, r := range rs {
			k := rb{r.rank, r.step / 100}
			b := buckets[k]
			if b == nil {
				b = &syncBucket{rank: r.rank, block: k.block, firstStep: r.step, firstTime: r.time, lastT: r.time}
				buckets[k] = b
			}
			if r.step < b.firstStep {
				b.firstStep, b.firstTime = r.step, r.time
			}
			b.lastT = max(b.lastT, r.time)
			// busy_ms: greatest(step_ms - coalesce(w, 0), 0), which is 0
			// without a step time (greatest skips NULLs).
			busy := 0.0
			if r.hasMS {
				w := 0.0
				if r.hasW {
					w = r.w
				}
				busy = pgMax(r.stepMS-w, 0)
			}
			b.m[1].add(busy)
			if has[i] {
				b.m[0].add(late[i])
				arrived := 0.0
				if pgEqual(late[i], latest) && pgLess(0, latest) {
					arrived = 1
				}
				b.m[3].add(arrived)
			}
			if s.nw == n {
				b.m[2].add(r.w - minW)
			}
		}
	}
	all := make([]*syncBucket, 0, len(buckets))
	for _, b := range buckets {
		all = append(all, b)
	}
	slices.SortFunc(all, func(x, y *syncBucket) int {
		return cmp.Or(cmp.Compare(x.rank, y.rank), cmp.Compare(x.block, y.block))
	})
	out := make([][]any, 0, len(all))
	for _, b := range all {
		if row := metricSet(runID, b.rank, b.block, syncSet, SyncMetrics, b.m[:], b.firstStep, b.firstTime, b.lastT); row != nil {
			out = append(out, row)
		}
	}
	return out
}
