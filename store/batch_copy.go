package store

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/deepseed/deepseed/api"
)

// copyTable is one table the batch writes through a temporary table.
type copyTable struct {
	kind   string
	temp   string
	target string
	cols   []string
	n      int
	row    func(i int, dst []any) []any
}

// tables lists the tables the batch writes. A table whose rows go in
// directly has its target as its temp.
func (b *batchPlan) tables() []copyTable {
	var ts []copyTable
	temp := func(kind, name, target string) string {
		if b.direct[kind] {
			return target
		}
		return name
	}
	if len(b.steps) > 0 {
		ts = append(ts, copyTable{api.KindStep, temp(api.KindStep, "tmp_steps", "steps"), "steps", stepCols, len(b.steps), b.stepRow})
	}
	if len(b.layers) > 0 {
		ts = append(ts, copyTable{api.KindLayers, temp(api.KindLayers, "tmp_layer_times", "layer_times"), "layer_times", layerCols, len(b.layers), b.layerRow})
	}
	if len(b.evals) > 0 {
		ts = append(ts, copyTable{api.KindEval, temp(api.KindEval, "tmp_evals", "evals"), "evals", evalCols, len(b.evals), b.evalRow})
	}
	if len(b.gpus) > 0 {
		ts = append(ts, copyTable{api.KindGPU, "tmp_gpu_samples", "gpu_samples", gpuCols, len(b.gpus), b.gpuRow})
	}
	if len(b.hosts) > 0 {
		ts = append(ts, copyTable{api.KindHost, "tmp_host_samples", "host_samples", hostCols, len(b.hosts), b.hostRow})
	}
	if len(b.mems) > 0 {
		ts = append(ts, copyTable{api.KindMemory, "tmp_memory_breakdowns", "memory_breakdowns", memCols, len(b.mems), b.memRow})
	}
	if len(b.events) > 0 {
		ts = append(ts, copyTable{api.KindEvent, "tmp_events", "events", eventCols, len(b.events), b.eventRow})
	}
	if len(b.untimed) > 0 {
		ts = append(ts, copyTable{api.KindEvent, "tmp_untimed_events", "events", eventCols, len(b.untimed), b.untimedRow})
	}
	return ts
}

// copy sends every record into its temporary table with COPY.
func (b *batchPlan) copy(ctx context.Context, tx batchConn) error {
	if len(b.layers) > 0 {
		b.alignLayers()
	}
	for _, t := range b.tables() {
		if t.kind == api.KindStep && b.inlined {
			continue
		}
		buf := make([]any, 0, len(t.cols))
		src := pgx.CopyFromSlice(t.n, func(i int) ([]any, error) {
			// pgx encodes a row before asking for the next, so one
			// buffer serves every row.
			return t.row(i, buf[:0]), nil
		})
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{t.temp}, t.cols, src); err != nil {
			return fmt.Errorf("store: write batch: copy %s: %w", t.target, err)
		}
	}
	return b.saveLayerNames(ctx, tx)
}

// f turns an optional number into a COPY value; NaN and the infinities
// pass through as float8 NaN and ±Infinity.
func f(p *api.Float) any {
	if p == nil {
		return nil
	}
	return float64(*p)
}

func optInt[T int | int64](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// jsonValue encodes v for a jsonb column; empty maps and slices are NULL.
func jsonValue[T any](v T, empty bool) any {
	if empty {
		return nil
	}
	js, err := json.Marshal(v)
	if err != nil {
		return nil
	}
	return string(js)
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
