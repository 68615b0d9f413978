package store

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// The straggler scores the alert evaluator stores (docs/alerts.md), kept
// as changes (docs/decisions/0013-straggler-scores-as-spans.md): a head
// per rank with the exact newest score (rank_score_heads), and spans of
// consecutive scored steps over which the score stays within ScoreEpsilon
// (rank_score_spans), which the score series expand into buckets.

// ScoreEpsilon bounds how far a stored straggler score series is from the
// scores the evaluator computed: a span holds consecutive steps whose
// scores' range, max − min, is at most ScoreEpsilon · max(1, |min|,
// |max|). Scores are fractions of a step, so that is 0.1 percentage point
// (1 % of the straggler alert's default 10 % threshold) up to a score of
// 1, and a relative 0.1 % above. migrations/0017_rank_score_spans.sql
// converted the rows stored before with the same rule.
const ScoreEpsilon = 1e-3

// RankScore is one rank's straggler score after a step, as the evaluator
// computes it; Late, Busy and Wait are nil where not finite.
type RankScore struct {
	Rank             int
	Step             int64
	Time             time.Time
	Late, Busy, Wait *float64
	Score            float64
}

// scoreSpan is a row of rank_score_spans: the scores of one rank over the
// consecutive steps [FirstStep, LastStep].
type scoreSpan struct {
	Rank                         int
	FirstStep, LastStep          int64
	FirstTime, LastTime          time.Time
	FirstScore, LastScore        float64
	MinScore, MaxScore, SumScore float64
}

func newScoreSpan(s RankScore) scoreSpan {
	return scoreSpan{Rank: s.Rank, FirstStep: s.Step, LastStep: s.Step, FirstTime: s.Time, LastTime: s.Time,
		FirstScore: s.Score, LastScore: s.Score, MinScore: s.Score, MaxScore: s.Score, SumScore: s.Score}
}

// sameScore is PostgreSQL's equality of doubles, where NaN equals NaN.
func sameScore(a, b float64) bool { return a == b || (math.IsNaN(a) && math.IsNaN(b)) }

// admits reports whether s extends the span: its step follows the span's
// last one and the span's scores with it stay within the tolerance of
// ScoreEpsilon. A non-finite score only joins a span of that same value.
func (sp *scoreSpan) admits(s RankScore) bool {
	if s.Step != sp.LastStep+1 {
		return false
	}
	if !finiteF(s.Score) || !finiteF(sp.MinScore) || !finiteF(sp.MaxScore) {
		return sameScore(s.Score, sp.MinScore) && sameScore(s.Score, sp.MaxScore)
	}
	lo, hi := min(sp.MinScore, s.Score), max(sp.MaxScore, s.Score)
	return hi-lo <= ScoreEpsilon*max(1, math.Abs(lo), math.Abs(hi))
}

func (sp *scoreSpan) extend(s RankScore) {
	sp.LastStep, sp.LastTime, sp.LastScore = s.Step, s.Time, s.Score
	if !finiteF(s.Score) {
		sp.SumScore += s.Score // the span's every score is this one
		return
	}
	sp.MinScore, sp.MaxScore = min(sp.MinScore, s.Score), max(sp.MaxScore, s.Score)
	sp.SumScore += s.Score
}

// foldScores folds scores into the ranks' heads and open spans (the span
// that ends at a rank's head), rank by rank in step order. A score for a
// step at or before its rank's head is dropped: the evaluator only scores
// forward, and a score once stored stays. It returns the heads and the
// spans that changed, the open ones updated in place.
func foldScores(heads map[int]RankScore, open map[int]scoreSpan, scores []RankScore) ([]RankScore, []scoreSpan) {
	sorted := slices.Clone(scores)
	slices.SortStableFunc(sorted, func(a, b RankScore) int {
		if a.Rank != b.Rank {
			return a.Rank - b.Rank
		}
		return cmp.Compare(a.Step, b.Step)
	})
	var outHeads []RankScore
	var outSpans []scoreSpan
	for i := 0; i < len(sorted); {
		rank := sorted[i].Rank
		head, hasHead := heads[rank]
		sp, hasSpan := open[rank]
		hasSpan = hasSpan && hasHead && sp.LastStep == head.Step
		changed := false
		for ; i < len(sorted) && sorted[i].Rank == rank; i++ {
			s := sorted[i]
			if hasHead && s.Step <= head.Step {
				continue
			}
			switch {
			case hasSpan && sp.admits(s):
				sp.extend(s)
			default:
				if changed {
					outSpans = append(outSpans, sp)
				}
				sp, hasSpan = newScoreSpan(s), true
			}
			head, hasHead, changed = s, true, true
		}
		if changed {
			outHeads = append(outHeads, head)
			outSpans = append(outSpans, sp)
		}
	}
	return outHeads, outSpans
}

// LastRankScores returns the scores of the run's newest scored step: the
// heads of the ranks scored at it.
func (s *Store) LastRankScores(ctx context.Context, runID string) ([]RankScore, error) {
	rows, err := s.pool.Query(ctx, `SELECT rank, step, time, lateness_ms, busy_ms, wait_ms, score FROM rank_score_heads
		WHERE run_id = $1 AND step = (SELECT max(step) FROM rank_score_heads WHERE run_id = $1) ORDER BY rank`, runID)
	if err != nil {
		return nil, fmt.Errorf("store: last scores of %s: %w", runID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (RankScore, error) {
		var s RankScore
		err := r.Scan(&s.Rank, &s.Step, &s.Time, &s.Late, &s.Busy, &s.Wait, &s.Score)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: last scores of %s: %w", runID, err)
	}
	return out, nil
}

// scoreHead is a rank's newest stored score and its step.
type scoreHead struct {
	Step  int64
	Score float64
}

// scoreHeads returns each rank's newest stored straggler score.
func (s *Store) scoreHeads(ctx context.Context, runID string) (map[int]scoreHead, error) {
	rows, err := s.pool.Query(ctx, `SELECT rank, step, score FROM rank_score_heads WHERE run_id = $1`, runID)
	if err != nil {
		return nil, fmt.Errorf("store: straggler scores of %s: %w", runID, err)
	}
	defer rows.Close()
	out := map[int]scoreHead{}
	for rows.Next() {
		var rank int
		var h scoreHead
		if err := rows.Scan(&rank, &h.Step, &h.Score); err != nil {
			return nil, fmt.Errorf("store: straggler scores of %s: %w", runID, err)
		}
		out[rank] = h
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: straggler scores of %s: %w", runID, err)
	}
	return out, nil
}

// scoresLockKey serialises the writers of a run's scores: each reads the
// heads it extends.
func scoresLockKey(run string) int64 { return lockKey(run, "scores") }

// AddRankScores stores scores of the run: each rank's newest becomes its
// head, and each extends the rank's open span or opens a new one
// (foldScores). A score for a step at or before its rank's head is
// dropped, so a score already stored stays.
func (s *Store) AddRankScores(ctx context.Context, runID string, scores []RankScore) error {
	if len(scores) == 0 {
		return nil
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, scoresLockKey(runID)); err != nil {
			return err
		}
		heads, open, err := openScores(ctx, tx, runID)
		if err != nil {
			return err
		}
		newHeads, spans := foldScores(heads, open, scores)
		if len(newHeads) == 0 {
			return nil
		}
		if err := writeScoreHeads(ctx, tx, runID, newHeads); err != nil {
			return err
		}
		return writeScoreSpans(ctx, tx, runID, spans)
	})
	if err != nil {
		return fmt.Errorf("store: store scores of %s: %w", runID, err)
	}
	return nil
}

// openScores reads the run's heads and each rank's newest span.
func openScores(ctx context.Context, tx pgx.Tx, runID string) (map[int]RankScore, map[int]scoreSpan, error) {
	rows, err := tx.Query(ctx, `SELECT h.rank, h.step, h.time, h.lateness_ms, h.busy_ms, h.wait_ms, h.score,
		       s.first_step, s.last_step, s.first_time, s.last_time, s.first_score, s.last_score, s.min_score, s.max_score, s.sum_score
		FROM rank_score_heads h LEFT JOIN LATERAL (
			SELECT * FROM rank_score_spans s WHERE s.run_id = h.run_id AND s.rank = h.rank ORDER BY first_step DESC LIMIT 1
		) s ON true
		WHERE h.run_id = $1`, runID)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	heads, open := map[int]RankScore{}, map[int]scoreSpan{}
	for rows.Next() {
		var h RankScore
		var first, last *int64
		var firstT, lastT *time.Time
		var fs, ls, mn, mx, sum *float64
		if err := rows.Scan(&h.Rank, &h.Step, &h.Time, &h.Late, &h.Busy, &h.Wait, &h.Score,
			&first, &last, &firstT, &lastT, &fs, &ls, &mn, &mx, &sum); err != nil {
			return nil, nil, err
		}
		heads[h.Rank] = h
		if first != nil {
			open[h.Rank] = scoreSpan{Rank: h.Rank, FirstStep: *first, LastStep: *last, FirstTime: *firstT, LastTime: *lastT,
				FirstScore: *fs, LastScore: *ls, MinScore: *mn, MaxScore: *mx, SumScore: *sum}
		}
	}
	return heads, open, rows.Err()
}

func writeScoreHeads(ctx context.Context, tx pgx.Tx, runID string, heads []RankScore) error {
	n := len(heads)
	ranks, steps, times := make([]int32, n), make([]int64, n), make([]time.Time, n)
	late, busy, wait, score := make([]*float64, n), make([]*float64, n), make([]*float64, n), make([]float64, n)
	for i, h := range heads {
		ranks[i], steps[i], times[i], score[i] = int32(h.Rank), h.Step, h.Time, h.Score
		late[i], busy[i], wait[i] = h.Late, h.Busy, h.Wait
	}
	_, err := tx.Exec(ctx, `INSERT INTO rank_score_heads (run_id, rank, step, time, lateness_ms, busy_ms, wait_ms, score)
		SELECT $1, * FROM unnest($2::int4[], $3::int8[], $4::timestamptz[], $5::float8[], $6::float8[], $7::float8[], $8::float8[])
		ON CONFLICT (run_id, rank) DO UPDATE SET step = EXCLUDED.step, time = EXCLUDED.time, lateness_ms = EXCLUDED.lateness_ms,
			busy_ms = EXCLUDED.busy_ms, wait_ms = EXCLUDED.wait_ms, score = EXCLUDED.score`,
		runID, ranks, steps, times, late, busy, wait, score)
	return err
}

func writeScoreSpans(ctx context.Context, tx pgx.Tx, runID string, spans []scoreSpan) error {
	n := len(spans)
	ranks, first, last := make([]int32, n), make([]int64, n), make([]int64, n)
	firstT, lastT := make([]time.Time, n), make([]time.Time, n)
	fs, ls, mn, mx, sum := make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
	for i, sp := range spans {
		ranks[i], first[i], last[i], firstT[i], lastT[i] = int32(sp.Rank), sp.FirstStep, sp.LastStep, sp.FirstTime, sp.LastTime
		fs[i], ls[i], mn[i], mx[i], sum[i] = sp.FirstScore, sp.LastScore, sp.MinScore, sp.MaxScore, sp.SumScore
	}
	_, err := tx.Exec(ctx, `INSERT INTO rank_score_spans (run_id, rank, first_step, last_step, first_time, last_time,
			first_score, last_score, min_score, max_score, sum_score)
		SELECT $1, * FROM unnest($2::int4[], $3::int8[], $4::int8[], $5::timestamptz[], $6::timestamptz[],
			$7::float8[], $8::float8[], $9::float8[], $10::float8[], $11::float8[])
		ON CONFLICT (run_id, rank, first_step) DO UPDATE SET last_step = EXCLUDED.last_step, last_time = EXCLUDED.last_time,
			last_score = EXCLUDED.last_score, min_score = EXCLUDED.min_score, max_score = EXCLUDED.max_score, sum_score = EXCLUDED.sum_score`,
		runID, ranks, first, last, firstT, lastT, fs, ls, mn, mx, sum)
	return err
}

// at is the span's score at step k, interpolated linearly between its
// first and last score: within the span's range, so within its tolerance
// of the score computed there.
func (sp *scoreSpan) at(k float64) float64 {
	if sameScore(sp.FirstScore, sp.LastScore) {
		return sp.FirstScore
	}
	return sp.FirstScore + (sp.LastScore-sp.FirstScore)*(k-float64(sp.FirstStep))/float64(sp.LastStep-sp.FirstStep)
}

// timeAt is the time of step k, interpolated between the span's first and
// last time, to the microsecond PostgreSQL keeps.
func (sp *scoreSpan) timeAt(k int64) time.Time {
	if k == sp.FirstStep {
		return sp.FirstTime
	}
	if k == sp.LastStep {
		return sp.LastTime
	}
	d := float64(sp.LastTime.Sub(sp.FirstTime)) * float64(k-sp.FirstStep) / float64(sp.LastStep-sp.FirstStep)
	return sp.FirstTime.Add(time.Duration(d)).Round(time.Microsecond)
}

// addTo adds the span's steps in [from, to] to the buckets of width
// steps they fall in, out ordered by rank and first step: the span's
// buckets follow those of the spans before it, the first of them maybe
// shared with the last one there. A bucket that holds the span whole
// takes its min, max and sum; one that holds part of it, the scores
// interpolated over that part (at).
func (sp *scoreSpan) addTo(out []RankBucket, from, to, width int64) []RankBucket {
	for b := max(sp.FirstStep, from) / width; b <= min(sp.LastStep, to)/width; b++ {
		lo, hi := max(sp.FirstStep, b*width, from), min(sp.LastStep, b*width+width-1, to)
		n := hi - lo + 1
		mn, mx, sum := sp.MinScore, sp.MaxScore, sp.SumScore
		if lo != sp.FirstStep || hi != sp.LastStep {
			a, z := sp.at(float64(lo)), sp.at(float64(hi))
			mn, mx, sum = pgMin(a, z), pgMax(a, z), float64(n)*sp.at(float64(lo+hi)/2)
		}
		if k := len(out) - 1; k >= 0 && out[k].Rank == sp.Rank && out[k].FirstStep/width == b {
			out[k].Min, out[k].Max = pgMin(out[k].Min, mn), pgMax(out[k].Max, mx)
			out[k].Sum += sum
			out[k].Count += n
			continue
		}
		out = append(out, RankBucket{Rank: sp.Rank, FirstStep: lo, FirstTime: sp.timeAt(lo), Min: mn, Max: mx, Sum: sum, Count: n})
	}
	return out
}

// ScoreBuckets returns each rank's stored straggler score over the steps
// in [from, to], bucketed by width steps, from the spans that overlap the
// range (addTo): where a bucket cuts a span, its scores within
// ScoreEpsilon of those computed and the time of its first step
// interpolated between the span's first and last time. It reads a row a
// span, however narrow the buckets.
func (s *Store) ScoreBuckets(ctx context.Context, runID string, from, to, width int64) ([]RankBucket, error) {
	if width < 1 {
		return nil, fmt.Errorf("store: straggler scores of %s: bucket width %d", runID, width)
	}
	rows, err := s.pool.Query(ctx, `SELECT rank, first_step, last_step, first_time, last_time,
			first_score, last_score, min_score, max_score, sum_score
		FROM rank_score_spans WHERE run_id = $1 AND first_step <= $3 AND last_step >= $2
		ORDER BY run_id, rank, first_step`, runID, from, to)
	if err != nil {
		return nil, fmt.Errorf("store: straggler scores of %s: %w", runID, err)
	}
	defer rows.Close()
	var out []RankBucket
	for rows.Next() {
		var sp scoreSpan
		if err := rows.Scan(&sp.Rank, &sp.FirstStep, &sp.LastStep, &sp.FirstTime, &sp.LastTime,
			&sp.FirstScore, &sp.LastScore, &sp.MinScore, &sp.MaxScore, &sp.SumScore); err != nil {
			return nil, fmt.Errorf("store: straggler scores of %s: %w", runID, err)
		}
		out = sp.addTo(out, from, to, width)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: straggler scores of %s: %w", runID, err)
	}
	return out, nil
}
