package store

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

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
	if len(b.layerGrown) > 0 {
		var ids, names []string
		for id := range b.layerGrown {
			js, _ := json.Marshal(b.layerNames[id])
			ids = append(ids, id)
			names = append(names, string(js))
		}
		if _, err := tx.Exec(ctx, `UPDATE runs AS r
			SET layer_names = ARRAY(SELECT jsonb_array_elements_text(u.names::jsonb)), updated_at = now()
			FROM unnest($1::text[], $2::text[]) AS u(run_id, names)
			WHERE r.run_id = u.run_id`, ids, names); err != nil {
			return fmt.Errorf("store: write batch: update layer names: %w", err)
		}
	}
	return nil
}

// alignLayers extends each run's layer names with the names it has not
// seen, in the order they arrive. A name that occurs k times in a record
// maps to its k-th occurrence in the run's names, so models that repeat a
// module name keep every instance apart.
func (b *batchPlan) alignLayers() {
	idx := map[string]map[string][]int{}
	for _, l := range b.layers {
		names := b.layerNames[l.RunID]
		pos := idx[l.RunID]
		if pos == nil {
			pos = map[string][]int{}
			for i, n := range names {
				pos[n] = append(pos[n], i)
			}
			idx[l.RunID] = pos
		}
		if namesPrefix(l.Names, names) {
			// The common case: a record lists the run's layers in order.
			continue
		}
		seen := map[string]int{}
		for _, n := range l.Names {
			k := seen[n]
			seen[n] = k + 1
			if k >= len(pos[n]) {
				pos[n] = append(pos[n], len(names))
				names = append(names, n)
				b.layerGrown[l.RunID] = true
			}
		}
		b.layerNames[l.RunID] = names
	}
	b.layerIdx = idx
}

// namesPrefix reports whether names starts with rec. Then the k-th
// occurrence of a name in rec is also its k-th occurrence in names, so the
// record's layers sit at their own positions.
func namesPrefix(rec, names []string) bool {
	if len(rec) > len(names) {
		return false
	}
	for i, n := range rec {
		if names[i] != n {
			return false
		}
	}
	return true
}

var (
	stepCols = []string{"run_id", "rank", "step", "time", "epoch", "loss", "lr", "grad_norm", "loss_scale", "skipped",
		"samples", "tokens", "throughput_sps", "throughput_tps", "step_ms", "forward_ms", "backward_ms", "optimizer_ms",
		"comm_ms", "data_ms", "gpu_util_pct", "gpu_mem_used_gb", "gpu_mem_peak_gb", "gpu_mem_reserved_gb", "cpu_util_pct", "tflops", "mfu",
		"sync_ns", "sync_wait_ms", "input_wait_ms", "comm_exposed_ms", "metrics"}
	layerCols = []string{"run_id", "rank", "step", "time", "forward_ms", "backward_ms"}
	evalCols  = []string{"run_id", "step", "time", "split", "loss", "accuracy", "f1", "metrics"}
	gpuCols   = []string{"time", "host", "gpu", "uuid", "name", "run_id", "rank", "util_pct", "mem_util_pct",
		"mem_used_bytes", "mem_total_bytes", "mem_reserved_bytes", "power_w", "energy_j", "temp_c", "mem_temp_c",
		"sm_clock_mhz", "mem_clock_mhz", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s", "pcie_replay_total",
		"nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s", "xid_last", "xid_total", "ecc_corrected_total",
		"ecc_uncorrected_total", "remapped_rows_total", "throttle_reasons", "sm_active_pct", "sm_occupancy_pct",
		"tensor_active_pct", "gr_engine_active_pct", "processes"}
	hostCols = []string{"time", "host", "cpu_util_pct", "mem_used_bytes", "mem_total_bytes", "load1", "processes"}
	memCols  = []string{"run_id", "rank", "time", "parameters_bytes", "gradients_bytes", "optimizer_bytes",
		"optimizer_device", "parameters_device", "activations_bytes"}
	eventCols = []string{"run_id", "time", "step", "rank", "type", "text"}
)

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

func (b *batchPlan) stepRow(i int, r []any) []any {
	s := b.steps[i]
	var skipped any
	if s.Skipped != nil {
		skipped = *s.Skipped
	}
	return append(r, s.RunID, int32(s.Rank), *s.Step, s.Time.Time, f(s.Epoch), f(s.Loss), f(s.LR), f(s.GradNorm),
		f(s.LossScale), skipped, optInt(s.Samples), optInt(s.Tokens), f(s.ThroughputSPS), f(s.ThroughputTPS),
		f(s.StepMS), f(s.ForwardMS), f(s.BackwardMS), f(s.OptimizerMS), f(s.CommMS), f(s.DataMS), f(s.GPUUtilPct),
		f(s.GPUMemUsedGB), f(s.GPUMemPeakGB), f(s.GPUMemResvGB), f(s.CPUUtilPct), f(s.TFLOPS), f(s.MFU),
		optInt(s.SyncNS), f(s.SyncWaitMS), f(s.InputWaitMS), f(s.CommExposedMS), jsonValue(s.Metrics, len(s.Metrics) == 0))
}

func (b *batchPlan) layerRow(i int, r []any) []any {
	l := b.layers[i]
	pos := b.layerIdx[l.RunID]
	width := len(b.layerNames[l.RunID])
	fwd := make([]pgtype.Float8, width)
	var bwd []pgtype.Float8
	if len(l.BackwardMS) > 0 {
		bwd = make([]pgtype.Float8, width)
	}
	// A record whose names start the run's list keeps its own positions
	// (alignLayers says why); any other finds each name's position, the
	// k-th occurrence of a repeated name taking the k-th position.
	own := namesPrefix(l.Names, b.layerNames[l.RunID])
	var seen map[string]int
	if !own {
		seen = make(map[string]int, len(l.Names))
	}
	for j, n := range l.Names {
		at := j
		if !own {
			k := seen[n]
			seen[n] = k + 1
			at = pos[n][k]
		}
		fwd[at] = pgtype.Float8{Float64: float64(l.ForwardMS[j]), Valid: true}
		if bwd != nil {
			bwd[at] = pgtype.Float8{Float64: float64(l.BackwardMS[j]), Valid: true}
		}
	}
	var bw any
	if bwd != nil {
		bw = bwd
	}
	return append(r, l.RunID, int32(l.Rank), *l.Step, l.Time.Time, fwd, bw)
}

func (b *batchPlan) evalRow(i int, r []any) []any {
	e := b.evals[i]
	return append(r, e.RunID, *e.Step, e.Time.Time, orDefault(e.Split, "val"), f(e.Loss), f(e.Accuracy), f(e.F1),
		jsonValue(e.Metrics, len(e.Metrics) == 0))
}

func (b *batchPlan) gpuRow(i int, r []any) []any {
	g := b.gpus[i]
	var rank any
	if g.Rank != nil {
		rank = int32(*g.Rank)
	}
	return append(r, g.Time.Time, g.Host, int32(*g.GPU), g.UUID, g.Name, g.RunID, rank, f(g.UtilPct), f(g.MemUtilPct),
		f(g.MemUsedBytes), f(g.MemTotalBytes), f(g.MemReservedBytes), f(g.PowerW), f(g.EnergyJ), f(g.TempC),
		f(g.MemTempC), f(g.SMClockMHz), f(g.MemClockMHz), f(g.PCIeTxBps), f(g.PCIeRxBps), f(g.PCIeReplays),
		f(g.NVLinkTxBps), f(g.NVLinkRxBps), f(g.XIDLast), f(g.XIDTotal), f(g.ECCCorrected), f(g.ECCUncorrected),
		f(g.RemappedRows), optInt(g.ThrottleReasons), f(g.SMActivePct), f(g.SMOccupancyPct), f(g.TensorActivePct),
		f(g.GrEngineActivePct), jsonValue(g.Processes, len(g.Processes) == 0))
}

func (b *batchPlan) hostRow(i int, r []any) []any {
	h := b.hosts[i]
	return append(r, h.Time.Time, h.Host, f(h.CPUUtilPct), f(h.MemUsedBytes), f(h.MemTotalBytes), f(h.Load1),
		jsonValue(h.Processes, len(h.Processes) == 0))
}

func (b *batchPlan) memRow(i int, r []any) []any {
	m := b.mems[i]
	return append(r, m.RunID, int32(m.Rank), m.Time.Time, f(m.ParametersBytes), f(m.GradientsBytes),
		f(m.OptimizerBytes), orDefault(m.OptimizerDevice, "gpu"), orDefault(m.ParametersDevice, "gpu"),
		f(m.ActivationsBytes))
}

func (b *batchPlan) eventRow(i int, r []any) []any { return eventRow(b.events[i], r) }

func (b *batchPlan) untimedRow(i int, r []any) []any { return eventRow(b.untimed[i], r) }

func eventRow(e *api.Event, r []any) []any {
	step, rank := int64(-1), int32(-1)
	if e.Step != nil {
		step = *e.Step
	}
	if e.Rank != nil {
		rank = int32(*e.Rank)
	}
	return append(r, e.RunID, e.Time.Time, step, rank, e.Type, e.Text)
}
