package store_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// scoreRun is a generated run's straggler scores as the evaluator
// computes them, by step, every rank at each step: an EWMA (weight 0.1)
// of each rank's lateness as a share of the median busy time. The healthy
// ranks' lateness is noise of about 1 % of a step; rank 1 straggles by 30
// % from step 300 and by 60 % from step 900; steps 400–404 were not
// scored (a rank missed them). Step times are 100 ms apart with ±jitter.
type scoreRun struct {
	ranks, steps int
	t0           time.Time
	jitter       time.Duration
	scores       []store.RankScore
}

func newScoreRun(ranks, steps int, seed uint64) scoreRun {
	rng := rand.New(rand.NewPCG(seed, 1))
	sr := scoreRun{ranks: ranks, steps: steps, t0: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), jitter: 10 * time.Millisecond}
	ewma := map[int]float64{}
	for step := 1; step <= steps; step++ {
		if step >= 400 && step <= 404 {
			continue
		}
		at := sr.t0.Add(time.Duration(step)*100*time.Millisecond +
			time.Duration(rng.Int64N(int64(2*sr.jitter))) - sr.jitter).Truncate(time.Microsecond)
		for rank := range ranks {
			late := math.Abs(rng.NormFloat64()) * 0.01
			if rank == 1 && step >= 300 {
				late += 0.3
			}
			if rank == 1 && step >= 900 {
				late += 0.3
			}
			v := late
			if e, ok := ewma[rank]; ok {
				v = 0.1*late + 0.9*e
			}
			ewma[rank] = v
			lateMS, busy, wait := late*70, 70+rng.Float64(), 30*rng.Float64()
			sr.scores = append(sr.scores, store.RankScore{Rank: rank, Step: int64(step), Time: at,
				Late: &lateMS, Busy: &busy, Wait: &wait, Score: v})
		}
	}
	return sr
}

// passes stores the run as the evaluator does, a pass of every steps at a
// time; each pass also sends the previous pass's last two steps again,
// with other scores, which must change nothing.
func (sr scoreRun) passes(t *testing.T, s *store.Store, runID string, every int64) {
	t.Helper()
	for lo := int64(1); lo <= int64(sr.steps); lo += every {
		var pass []store.RankScore
		for _, x := range sr.scores {
			switch {
			case x.Step >= lo && x.Step < lo+every:
				pass = append(pass, x)
			case x.Step >= lo-2 && x.Step < lo:
				x.Score += 1
				pass = append(pass, x)
			}
		}
		if err := s.AddRankScores(context.Background(), runID, pass); err != nil {
			t.Fatal(err)
		}
	}
}

// oldBuckets are the buckets the row-per-step storage answered: each
// rank's scores in [from, to] grouped by step / width.
func (sr scoreRun) oldBuckets(from, to, width int64) []store.RankBucket {
	type key struct {
		rank int
		b    int64
	}
	at := map[key]int{}
	var out []store.RankBucket
	for _, x := range sr.scores {
		if x.Step < from || x.Step > to {
			continue
		}
		k := key{x.Rank, x.Step / width}
		i, ok := at[k]
		if !ok {
			at[k], i = len(out), len(out)
			out = append(out, store.RankBucket{Rank: x.Rank, FirstStep: x.Step, FirstTime: x.Time, Min: x.Score, Max: x.Score})
		}
		b := &out[i]
		b.Min, b.Max = min(b.Min, x.Score), max(b.Max, x.Score)
		b.Sum += x.Score
		b.Count++
	}
	slices.SortFunc(out, func(a, b store.RankBucket) int {
		if a.Rank != b.Rank {
			return a.Rank - b.Rank
		}
		return int(a.FirstStep - b.FirstStep)
	})
	return out
}

func scoreTol(v ...float64) float64 {
	m := 1.0
	for _, x := range v {
		m = max(m, math.Abs(x))
	}
	return store.ScoreEpsilon * m
}

// The score series read from the spans are the series of the scores the
// evaluator computed, within ScoreEpsilon, at any bucket width and over
// ranges that cut spans; bucket steps and counts are exact, times within
// the steps' jitter (interpolated within a span). The heads are exactly
// the newest scores.
func TestScoreSpansAnswerTheScoresWithinEpsilon(t *testing.T) {
	ctx := context.Background()
	s := storetest.NewStore(t)
	sr := newScoreRun(6, 1500, 7)
	sr.passes(t, s, "spans", 37)

	for _, c := range []struct{ from, to, width int64 }{
		{1, 1500, 1}, {1, 1500, 7}, {1, 1500, 100}, {0, 1599, 400},
		{123, 456, 1}, {123, 456, 10}, {299, 905, 64}, {398, 406, 1}, {1500, 1500, 1},
	} {
		got, err := s.ScoreBuckets(ctx, "spans", c.from, c.to, c.width)
		if err != nil {
			t.Fatal(err)
		}
		want := sr.oldBuckets(c.from, c.to, c.width)
		if len(got) != len(want) {
			t.Fatalf("steps %d–%d by %d: %d buckets, want %d", c.from, c.to, c.width, len(got), len(want))
		}
		for i, g := range got {
			w := want[i]
			tol := scoreTol(w.Min, w.Max)
			if g.Rank != w.Rank || g.FirstStep != w.FirstStep || g.Count != w.Count ||
				math.Abs(g.Min-w.Min) > tol || math.Abs(g.Max-w.Max) > tol ||
				math.Abs(g.Sum/float64(g.Count)-w.Sum/float64(w.Count)) > tol {
				t.Fatalf("steps %d–%d by %d: bucket %+v, want %+v within %g", c.from, c.to, c.width, g, w, tol)
			}
			if d := g.FirstTime.Sub(w.FirstTime).Abs(); d > 2*sr.jitter {
				t.Fatalf("steps %d–%d by %d: bucket of rank %d at step %d: time %v, want %v within %v",
					c.from, c.to, c.width, g.Rank, g.FirstStep, g.FirstTime, w.FirstTime, 2*sr.jitter)
			}
		}
	}

	last, err := s.LastRankScores(ctx, "spans")
	if err != nil {
		t.Fatal(err)
	}
	newest := sr.scores[len(sr.scores)-sr.ranks:]
	if len(last) != sr.ranks {
		t.Fatalf("%d heads, want %d", len(last), sr.ranks)
	}
	for i, h := range last {
		w := newest[i]
		if h.Rank != w.Rank || h.Step != w.Step || !h.Time.Equal(w.Time) || h.Score != w.Score ||
			*h.Late != *w.Late || *h.Busy != *w.Busy || *h.Wait != *w.Wait {
			t.Errorf("head of rank %d: %+v, want the newest score exactly: %+v", w.Rank, h, w)
		}
	}

	var spans int
	if err := storetest.Pool(t, s).QueryRow(ctx, `SELECT count(*) FROM rank_score_spans WHERE run_id = 'spans'`).Scan(&spans); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d spans for %d rank-steps (%.1f %%)", spans, len(sr.scores), 100*float64(spans)/float64(len(sr.scores)))
	if spans >= len(sr.scores)/2 {
		t.Errorf("%d spans for %d scores: the noise of healthy ranks should stay within the tolerance", spans, len(sr.scores))
	}
}

// A steady run's stored rows grow with its scores' changes, not with the
// evaluator's passes: scoring it in passes of 10 steps leaves exactly
// the spans one pass over every step leaves, and the passes over steps
// whose scores stay put add none.
func TestScoreRowsGrowWithChangesNotPasses(t *testing.T) {
	ctx := context.Background()
	s := storetest.NewStore(t)
	// Four ranks; rank 3 is 25 % of a step late from the start, and from
	// step 3000 on 50 %, so its EWMA climbs again. Between, every score
	// stays within a few millionths.
	var scores []store.RankScore
	t0 := time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC)
	ewma := map[int]float64{}
	for step := int64(1); step <= 4000; step++ {
		for rank := range 4 {
			late := 1e-6 * float64(step%3)
			if rank == 3 {
				late += 0.25
				if step >= 3000 {
					late += 0.25
				}
			}
			v := late
			if e, ok := ewma[rank]; ok {
				v = 0.1*late + 0.9*e
			}
			ewma[rank] = v
			scores = append(scores, store.RankScore{Rank: rank, Step: step, Time: t0.Add(time.Duration(step) * time.Second), Score: v})
		}
	}
	count := func(run string) (spans, heads int) {
		t.Helper()
		if err := storetest.Pool(t, s).QueryRow(ctx, `SELECT (SELECT count(*) FROM rank_score_spans WHERE run_id = $1),
			(SELECT count(*) FROM rank_score_heads WHERE run_id = $1)`, run).Scan(&spans, &heads); err != nil {
			t.Fatal(err)
		}
		return spans, heads
	}
	if err := s.AddRankScores(ctx, "once", scores); err != nil {
		t.Fatal(err)
	}
	once, _ := count("once")
	var at2000, at3000 int
	for lo := int64(1); lo <= 4000; lo += 10 {
		i, j := (lo-1)*4, min(lo+9, 4000)*4
		if err := s.AddRankScores(ctx, "passes", scores[i:j]); err != nil {
			t.Fatal(err)
		}
		switch lo + 9 {
		case 2000:
			at2000, _ = count("passes")
		case 2990:
			at3000, _ = count("passes")
		}
	}
	spans, heads := count("passes")
	if spans != once || heads != 4 {
		t.Errorf("passes of 10 steps left %d spans and %d heads; one pass %d spans, 4 heads", spans, heads, once)
	}
	if at3000 != at2000 {
		t.Errorf("99 passes over steady scores added %d spans (%d at step 2000, %d at step 2990)", at3000-at2000, at2000, at3000)
	}
	if spans <= at3000 {
		t.Errorf("rank 3's climb from step 3000 added no span: %d then %d", at3000, spans)
	}
	t.Logf("%d spans for %d rank-steps: %d by step 2000, %d after rank 3's second climb", spans, len(scores), at2000, spans)
}

// Migration 0017 converts the rows of rank_scores into the spans and
// heads that storing the same scores leaves, byte for byte: the same
// fold with the same tolerance, non-finite scores and gaps included.
func TestMigrationConvertsRankScores(t *testing.T) {
	ctx := context.Background()
	s := storetest.NewStore(t)
	pool := storetest.Pool(t, s)
	ms, err := store.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	// The schema as it was before 0017, with its rows.
	if _, err := pool.Exec(ctx, `DROP SCHEMA public CASCADE; CREATE SCHEMA public;
		CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.Version >= 17 {
			continue
		}
		if _, err := pool.Exec(ctx, m.SQL); err != nil {
			t.Fatalf("%s: %v", m.Name, err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
			t.Fatal(err)
		}
	}
	sr := newScoreRun(4, 1200, 11)
	// Rank 3 scores NaN over steps 500–509 and +Inf at 700–701.
	for i, x := range sr.scores {
		if x.Rank == 3 && x.Step >= 500 && x.Step < 510 {
			sr.scores[i].Score = math.NaN()
		}
		if x.Rank == 3 && (x.Step == 700 || x.Step == 701) {
			sr.scores[i].Score = math.Inf(1)
		}
	}
	var vals []string
	var args []any
	for _, x := range sr.scores {
		n := len(args)
		vals = append(vals, fmt.Sprintf("('old', $%d::int, $%d::bigint, $%d::timestamptz, $%d::float8, $%d::float8, $%d::float8, $%d::float8)",
			n+1, n+2, n+3, n+4, n+5, n+6, n+7))
		args = append(args, x.Rank, x.Step, x.Time, *x.Late, *x.Busy, *x.Wait, x.Score)
		if len(args) >= 7000 || x == sr.scores[len(sr.scores)-1] {
			if _, err := pool.Exec(ctx, `INSERT INTO rank_scores (run_id, rank, step, time, lateness_ms, busy_ms, wait_ms, score) VALUES `+
				strings.Join(vals, ", "), args...); err != nil {
				t.Fatal(err)
			}
			vals, args = nil, nil
		}
	}
	var oldBytes int64
	if err := pool.QueryRow(ctx, `SELECT pg_total_relation_size('rank_scores')`).Scan(&oldBytes); err != nil {
		t.Fatal(err)
	}
	applied, err := s.Migrate(ctx)
	if err != nil || len(applied) == 0 || applied[0] != "0017_rank_score_spans.sql" {
		t.Fatalf("migrate: %v, %v", applied, err)
	}
	var gone bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('rank_scores') IS NULL`).Scan(&gone); err != nil || !gone {
		t.Fatalf("rank_scores still there after the migration (%v)", err)
	}
	sr.passes(t, s, "new", 50)

	for _, q := range []string{
		`SELECT rank, first_step, last_step, first_time, last_time, first_score, last_score, min_score, max_score, sum_score
			FROM rank_score_spans WHERE run_id = $1`,
		`SELECT rank, step, time, lateness_ms, busy_ms, wait_ms, score FROM rank_score_heads WHERE run_id = $1`,
	} {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM (`+q+`) x`, "old").Scan(&n); err != nil || n == 0 {
			t.Fatalf("%d rows converted (%v): %s", n, err, q)
		}
		var diff int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM ((`+strings.ReplaceAll(q, "$1", "'old'")+` EXCEPT `+strings.ReplaceAll(q, "$1", "'new'")+`)
			UNION ALL (`+strings.ReplaceAll(q, "$1", "'new'")+` EXCEPT `+strings.ReplaceAll(q, "$1", "'old'")+`)) d`).Scan(&diff); err != nil {
			t.Fatal(err)
		}
		if diff != 0 {
			t.Errorf("%d rows differ between the converted and the stored scores: %s", diff, q)
		}
	}
	var newBytes, spans int64
	if err := pool.QueryRow(ctx, `SELECT pg_total_relation_size('rank_score_spans') + pg_total_relation_size('rank_score_heads'),
		(SELECT count(*) FROM rank_score_spans WHERE run_id = 'old')`).Scan(&newBytes, &spans); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d rows of rank_scores (%d kB) became %d spans; both runs' spans and heads take %d kB", len(sr.scores), oldBytes/1024, spans, newBytes/1024)
}

// Writers racing over the same run (two evaluators, were the session
// lock lost) leave what one writer leaves: each extends the heads it read
// under the run's lock, and a step once stored stays.
func TestScoreWritersRacing(t *testing.T) {
	ctx := context.Background()
	s := storetest.NewStore(t)
	sr := newScoreRun(4, 600, 3)
	sr.passes(t, s, "one", 20)
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			var err error
			for lo := int64(1); lo <= int64(sr.steps) && err == nil; lo += 20 {
				var pass []store.RankScore
				for _, x := range sr.scores {
					if x.Step >= lo && x.Step < lo+20 {
						pass = append(pass, x)
					}
				}
				err = s.AddRankScores(ctx, "racing", pass)
			}
			errs <- err
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	q := `SELECT rank, first_step, last_step, first_time, last_time, first_score, last_score, min_score, max_score, sum_score
		FROM rank_score_spans WHERE run_id = `
	var diff int
	if err := storetest.Pool(t, s).QueryRow(ctx, `SELECT count(*) FROM ((`+q+`'one' EXCEPT `+q+`'racing')
		UNION ALL (`+q+`'racing' EXCEPT `+q+`'one')) d`).Scan(&diff); err != nil {
		t.Fatal(err)
	}
	if diff != 0 {
		t.Errorf("racing writers left %d spans that one writer does not", diff)
	}
}
