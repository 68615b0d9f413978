package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// The memory_breakdowns table: each rank's newest memory breakdown.

var memCols = []string{"run_id", "rank", "time", "parameters_bytes", "gradients_bytes", "optimizer_bytes",
	"optimizer_device", "parameters_device", "activations_bytes"}

func (b *batchPlan) memRow(i int, r []any) []any {
	m := b.mems[i]
	return append(r, m.RunID, int32(m.Rank), m.Time.Time, f(m.ParametersBytes), f(m.GradientsBytes),
		f(m.OptimizerBytes), orDefault(m.OptimizerDevice, "gpu"), orDefault(m.ParametersDevice, "gpu"),
		f(m.ActivationsBytes))
}

// A resent breakdown without a time gets a new one; it only counts as
// an update when its numbers differ.
const mergeMemory = `INSERT INTO memory_breakdowns AS m
	SELECT DISTINCT ON (run_id, rank) * FROM tmp_memory_breakdowns ORDER BY run_id, rank, time DESC
	ON CONFLICT (run_id, rank) DO UPDATE SET
		time = EXCLUDED.time,
		parameters_bytes = EXCLUDED.parameters_bytes,
		gradients_bytes = EXCLUDED.gradients_bytes,
		optimizer_bytes = EXCLUDED.optimizer_bytes,
		optimizer_device = EXCLUDED.optimizer_device,
		parameters_device = EXCLUDED.parameters_device,
		activations_bytes = EXCLUDED.activations_bytes
	WHERE m.time < EXCLUDED.time
	  AND (m.parameters_bytes, m.gradients_bytes, m.optimizer_bytes, m.optimizer_device, m.parameters_device, m.activations_bytes)
	      IS DISTINCT FROM (EXCLUDED.parameters_bytes, EXCLUDED.gradients_bytes, EXCLUDED.optimizer_bytes,
	      EXCLUDED.optimizer_device, EXCLUDED.parameters_device, EXCLUDED.activations_bytes)`

// MemoryRow is a run's predicted ZeRO breakdown.
type MemoryRow struct {
	Params, Grads, Optim, Activations *float64
	OptimDevice, ParamsDevice         string
}

// Memory returns the breakdown of the lowest rank that sent one, or nil.
func (s *Store) Memory(ctx context.Context, runID string) (*MemoryRow, error) {
	var m MemoryRow
	err := s.pool.QueryRow(ctx, `SELECT parameters_bytes, gradients_bytes, optimizer_bytes, activations_bytes,
		optimizer_device, parameters_device FROM memory_breakdowns WHERE run_id = $1 ORDER BY rank LIMIT 1`, runID).
		Scan(&m.Params, &m.Grads, &m.Optim, &m.Activations, &m.OptimDevice, &m.ParamsDevice)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("store: memory of %s: %w", runID, err)
	}
	return &m, nil
}
