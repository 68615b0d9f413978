package store

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// layerBucket accumulates one layer rollup bucket: per-layer sums and
// counts of non-NULL values, aligned with runs.layer_names.
type layerBucket struct {
	key                  bucketKey
	firstStep            int64
	firstTime            int64 // microseconds since the PostgreSQL epoch
	rows                 int64
	fwdSums, bwdSums     []float64
	fwdCounts, bwdCounts []int64
}

func (b *layerBucket) row(runID string, w int64) []any {
	// Sums are never NULL: a bucket without values is '{}'. Counts are
	// NULL where every row timed every layer (layerCountsSQL).
	pass := func(f []float64, c []int64) ([]float64, []int64) {
		if f == nil {
			return []float64{}, nil
		}
		if len(c) == len(f) && !slices.ContainsFunc(c, func(n int64) bool { return n != b.rows }) {
			return f, nil
		}
		return f, c
	}
	fs, fc := pass(b.fwdSums, b.fwdCounts)
	bs, bc := pass(b.bwdSums, b.bwdCounts)
	return []any{runID, b.key.rank, int32(w), b.key.bucket, b.firstStep, pgTime(b.firstTime), b.rows, fs, fc, bs, bc}
}

// layerCountsSQL is the SQL of a layer rollup's counts of one pass ("fwd"
// or "bwd") of the table or alias t: stored NULL where each is the
// bucket's rows (migration 0022), once per layer of the sums.
func layerCountsSQL(t, pass string) string {
	c, s, rows := pass+"_counts", pass+"_sums", "rows"
	if t != "" {
		c, s, rows = t+"."+c, t+"."+s, t+".rows"
	}
	return "coalesce(" + c + ", array_fill(" + rows + ", ARRAY[cardinality(" + s + ")]))"
}

var layerRollupColumns = []string{"run_id", "rank", "width", "bucket", "first_step", "first_time", "rows",
	"fwd_sums", "fwd_counts", "bwd_sums", "bwd_counts"}

var layerRollups = rollupTable{names: []string{"layer_rollups"}, raw: rawLayerRollups, coarser: coarserLayerRollups}

// rawLayerRollups writes the width-100 layer rollups of the spans. The
// raw arrays are streamed in binary and summed in Go without decoding
// them into values of their own: a 1,000,000-step, 100-layer run is 100M
// elements, which SQL's unnest and GROUP BY take many minutes to sum.
func rawLayerRollups(ctx context.Context, tx pgx.Tx, runID string, ranks []int32, los, his []int64) error {
	rows, err := tx.Query(ctx, `
		SELECT l.rank, l.time, l.step, l.forward_ms, l.backward_ms
		FROM unnest($2::int[], $3::bigint[], $4::bigint[]) AS d(rank, lo, hi) JOIN layer_times l
		ON l.run_id = $1 AND l.rank = d.rank AND l.step >= d.lo * 100 AND l.step < (d.hi + 1) * 100`,
		runID, ranks, los, his)
	if err != nil {
		return fmt.Errorf("read layer times: %w", err)
	}
	buckets, err := foldLayers(rows)
	if err != nil {
		return fmt.Errorf("read layer times: %w", err)
	}
	return copyLayerRollups(ctx, tx, runID, 100, buckets)
}

// coarserLayerRollups writes the layer rollups of width w of parents,
// summed in Go from the buckets of width cw below them.
func coarserLayerRollups(ctx context.Context, tx pgx.Tx, runID string, parents []bucketKey, w, cw int64) error {
	pr, pl, ph := spans(parents)
	f := w / cw
	rows, err := tx.Query(ctx, `
		SELECT l.rank, l.bucket, l.first_step, l.first_time, l.rows, l.fwd_sums, `+layerCountsSQL("l", "fwd")+`,
			l.bwd_sums, `+layerCountsSQL("l", "bwd")+`
		FROM unnest($2::int[], $3::bigint[], $4::bigint[]) AS d(rank, lo, hi) JOIN layer_rollups l
		ON l.run_id = $1 AND l.rank = d.rank AND l.width = $5 AND l.bucket >= d.lo * $6 AND l.bucket < (d.hi + 1) * $6`,
		runID, pr, pl, ph, cw, f)
	if err != nil {
		return fmt.Errorf("read layer rollups of width %d: %w", cw, err)
	}
	buckets, err := foldLayerRollups(rows, f)
	if err != nil {
		return fmt.Errorf("read layer rollups of width %d: %w", cw, err)
	}
	return copyLayerRollups(ctx, tx, runID, w, buckets)
}

func copyLayerRollups(ctx context.Context, tx pgx.Tx, runID string, w int64, buckets []*layerBucket) error {
	out := make([][]any, len(buckets))
	for i, b := range buckets {
		out[i] = b.row(runID, w)
	}
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"layer_rollups"}, layerRollupColumns, pgx.CopyFromRows(out)); err != nil {
		return fmt.Errorf("write layer rollups of width %d: %w", w, err)
	}
	return nil
}

// layerFolder finds the bucket of each row, remembering the last one:
// rows arrive mostly in step order.
type layerFolder struct {
	byKey map[bucketKey]*layerBucket
	last  *layerBucket
}

func (f *layerFolder) bucket(k bucketKey, step, tm int64) *layerBucket {
	b := f.last
	if b == nil || b.key != k {
		b = f.byKey[k]
		if b == nil {
			b = &layerBucket{key: k, firstStep: step, firstTime: tm}
			f.byKey[k] = b
		}
		f.last = b
	}
	if step < b.firstStep {
		b.firstStep, b.firstTime = step, tm
	}
	return b
}

func (f *layerFolder) sorted() []*layerBucket {
	out := make([]*layerBucket, 0, len(f.byKey))
	for _, b := range f.byKey {
		out = append(out, b)
	}
	slices.SortFunc(out, func(a, b *layerBucket) int { return compareKeys(a.key, b.key) })
	return out
}

// foldLayers folds raw layer_times rows (rank, time, step, forward_ms,
// backward_ms) into width-100 buckets.
func foldLayers(rows pgx.Rows) ([]*layerBucket, error) {
	defer rows.Close()
	if err := requireBinary(rows); err != nil {
		return nil, err
	}
	f := layerFolder{byKey: map[bucketKey]*layerBucket{}}
	for rows.Next() {
		v := rows.RawValues()
		rank, tm, step, err := rawRowHead(v)
		if err != nil {
			return nil, err
		}
		b := f.bucket(bucketKey{rank, step / 100}, step, tm)
		b.rows++
		if b.fwdSums, b.fwdCounts, err = addFloat8Array(v[3], b.fwdSums, b.fwdCounts); err != nil {
			return nil, fmt.Errorf("forward_ms of step %d: %w", step, err)
		}
		if b.bwdSums, b.bwdCounts, err = addFloat8Array(v[4], b.bwdSums, b.bwdCounts); err != nil {
			return nil, fmt.Errorf("backward_ms of step %d: %w", step, err)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return f.sorted(), nil
}

// foldLayerRollups folds layer rollup rows of one width into the buckets
// factor times wider.
func foldLayerRollups(rows pgx.Rows, factor int64) ([]*layerBucket, error) {
	defer rows.Close()
	f := layerFolder{byKey: map[bucketKey]*layerBucket{}}
	for rows.Next() {
		var (
			k          bucketKey
			step, n    int64
			tm         time.Time
			fs, bs     []float64
			fc, bc     []int64
			firstMicro int64
		)
		if err := rows.Scan(&k.rank, &k.bucket, &step, &tm, &n, &fs, &fc, &bs, &bc); err != nil {
			return nil, err
		}
		firstMicro = tm.Sub(pgEpoch).Microseconds()
		k.bucket /= factor
		b := f.bucket(k, step, firstMicro)
		b.rows += n
		b.fwdSums, b.fwdCounts = addSums(b.fwdSums, b.fwdCounts, fs, fc)
		b.bwdSums, b.bwdCounts = addSums(b.bwdSums, b.bwdCounts, bs, bc)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return f.sorted(), nil
}

func addSums(sums []float64, counts []int64, s []float64, c []int64) ([]float64, []int64) {
	sums, counts = grow(sums, counts, max(len(s), len(c)))
	for i, v := range s {
		sums[i] += v
	}
	for i, v := range c {
		counts[i] += v
	}
	return sums, counts
}

func grow(sums []float64, counts []int64, n int) ([]float64, []int64) {
	for len(sums) < n {
		sums = append(sums, 0)
	}
	for len(counts) < n {
		counts = append(counts, 0)
	}
	return sums, counts
}

// addFloat8Array adds the non-NULL elements of a float8[] value in
// PostgreSQL's binary format to sums and counts, element i to index i,
// growing them to the array's length. A NULL array adds nothing.
//
// The format: int32 number of dimensions, int32 has-nulls flag, uint32
// element type, then per dimension int32 length and lower bound, then per
// element an int32 byte length (-1 for NULL) and the value.
func addFloat8Array(src []byte, sums []float64, counts []int64) ([]float64, []int64, error) {
	if src == nil {
		return sums, counts, nil
	}
	if len(src) < 12 {
		return nil, nil, fmt.Errorf("array of %d bytes", len(src))
	}
	ndim := int32(binary.BigEndian.Uint32(src))
	if ndim == 0 {
		return sums, counts, nil
	}
	if ndim != 1 || len(src) < 20 {
		return nil, nil, fmt.Errorf("array of %d dimensions", ndim)
	}
	if oid := binary.BigEndian.Uint32(src[8:]); oid != pgtype.Float8OID {
		return nil, nil, fmt.Errorf("array of type %d, want float8", oid)
	}
	n := int(int32(binary.BigEndian.Uint32(src[12:])))
	sums, counts = grow(sums, counts, n)
	p := src[20:]
	for i := 0; i < n; i++ {
		if len(p) < 4 {
			return nil, nil, fmt.Errorf("array truncated at element %d", i)
		}
		l := int32(binary.BigEndian.Uint32(p))
		p = p[4:]
		if l < 0 {
			continue
		}
		if l != 8 || len(p) < 8 {
			return nil, nil, fmt.Errorf("array element %d of %d bytes", i, l)
		}
		sums[i] += math.Float64frombits(binary.BigEndian.Uint64(p))
		counts[i]++
		p = p[8:]
	}
	return sums, counts, nil
}

// requireBinary checks that every column of rows travels in binary, as
// the raw decoders here expect; pgx asks for binary for every type they
// read.
// rawRowHead decodes the rank, time and step that lead every raw row a
// refresh reads, in binary format.
func rawRowHead(v [][]byte) (rank int32, tm, step int64, err error) {
	if rank, err = rawInt4(v[0]); err != nil {
		return 0, 0, 0, err
	}
	if tm, err = rawInt8(v[1]); err != nil {
		return 0, 0, 0, err
	}
	step, err = rawInt8(v[2])
	return rank, tm, step, err
}

func requireBinary(rows pgx.Rows) error {
	for _, fd := range rows.FieldDescriptions() {
		if fd.Format != pgtype.BinaryFormatCode {
			return fmt.Errorf("column %s arrives as text", fd.Name)
		}
	}
	return nil
}

func rawInt4(b []byte) (int32, error) {
	if len(b) != 4 {
		return 0, fmt.Errorf("int4 of %d bytes", len(b))
	}
	return int32(binary.BigEndian.Uint32(b)), nil
}

// rawInt8 decodes an int8, a float8's bits or a timestamptz's microseconds.
func rawInt8(b []byte) (int64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("8-byte value of %d bytes", len(b))
	}
	return int64(binary.BigEndian.Uint64(b)), nil
}

// pgEpoch is where PostgreSQL's binary timestamps count from.
var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

func pgTime(micros int64) time.Time {
	return pgEpoch.Add(time.Duration(micros) * time.Microsecond)
}
