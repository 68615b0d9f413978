package store

import (
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/deepseed/deepseed/api"
)

// inlineMaxSteps bounds the batches whose steps are inserted from arrays
// in the prepare round trip rather than copied: a small batch is what every
// rank of a many-rank run sends, and for it the COPY's own two round trips
// cost more than its rows.
const inlineMaxSteps = 64

// inlineSteps queues, in place of the probe for stored step keys, an
// insert of the batch's steps that happens only when none of their keys is
// stored; the count it answers says which it was. It runs under the rank
// locks, so the answer holds until commit.
func (b *batchPlan) inlineSteps(q *pgx.Batch, check directCheck) {
	cols := make([]any, len(stepCols))
	for c, typ := range stepColTypes {
		cols[c] = newColumn(typ, len(b.steps))
	}
	row := make([]any, 0, len(stepCols))
	for i := range b.steps {
		row = b.stepRow(i, row[:0])
		for c, v := range row {
			cols[c] = appendColumn(cols[c], v)
		}
	}
	args := append(append([]any{}, check.args...), cols...)
	var casts, sel []string
	for c, name := range stepCols {
		casts = append(casts, fmt.Sprintf("$%d::%s[]", len(check.args)+c+1, stepColTypes[c]))
		if name == "metrics" {
			sel = append(sel, "u.metrics::jsonb")
		} else {
			sel = append(sel, "u."+name)
		}
	}
	sql := `INSERT INTO steps (` + strings.Join(stepCols, ", ") + `)
		SELECT ` + strings.Join(sel, ", ") + ` FROM unnest(` + strings.Join(casts, ", ") + `) AS u(` + strings.Join(stepCols, ", ") + `)
		WHERE NOT (` + check.sql + `)`
	n := len(b.steps)
	q.Queue(sql, args...).Exec(func(tag pgconn.CommandTag) error {
		inserted := int(tag.RowsAffected())
		switch inserted {
		case n:
			b.direct[api.KindStep] = true
			b.inlined = true
		case 0:
			b.direct[api.KindStep] = false
		default:
			return fmt.Errorf("insert steps: %d of %d rows inserted", inserted, n)
		}
		return nil
	})
}

// stepColTypes are the PostgreSQL types of stepCols, in order, from the
// Go types of the step table's fields; metrics travels as text and is cast.
var stepColTypes = func() []string {
	types := []string{"text", "int4", "int8", "timestamptz"}
	for _, sf := range api.StepFields {
		switch sf.Field(&api.Step{}).(type) {
		case **api.Float:
			types = append(types, "float8")
		case **int64:
			types = append(types, "int8")
		case **bool:
			types = append(types, "bool")
		default:
			panic("store: step field " + sf.Name + " of no column type")
		}
	}
	return append(types, "text")
}()

// newColumn returns an empty array of the Go type pgx encodes as typ[].
func newColumn(typ string, n int) any {
	switch typ {
	case "text":
		return make([]*string, 0, n)
	case "int4":
		return make([]*int32, 0, n)
	case "int8":
		return make([]*int64, 0, n)
	case "timestamptz":
		return make([]*time.Time, 0, n)
	case "float8":
		return make([]*float64, 0, n)
	case "bool":
		return make([]*bool, 0, n)
	}
	panic("store: no array column for " + typ)
}

// appendColumn appends one COPY value (nil for NULL) to its column.
func appendColumn(col, v any) any {
	switch s := col.(type) {
	case []*string:
		return appendValue[string](s, v)
	case []*int32:
		return appendValue[int32](s, v)
	case []*int64:
		return appendValue[int64](s, v)
	case []*time.Time:
		return appendValue[time.Time](s, v)
	case []*float64:
		return appendValue[float64](s, v)
	case []*bool:
		return appendValue[bool](s, v)
	}
	panic(fmt.Sprintf("store: no array column for %T", col))
}

func appendValue[T any](s []*T, v any) []*T {
	if v == nil {
		return append(s, nil)
	}
	x := v.(T)
	return append(s, &x)
}

// allDirect reports whether every step, layers and evaluation row of the
// batch goes straight into its table: no key of them is stored or repeated.
func (b *batchPlan) allDirect() bool {
	return (len(b.steps) == 0 || b.direct[api.KindStep]) &&
		(len(b.layers) == 0 || b.direct[api.KindLayers]) &&
		(len(b.evals) == 0 || b.direct[api.KindEval])
}
