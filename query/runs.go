package query

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
)

var runStatuses = map[string]bool{api.StatusRunning: true, api.StatusFinished: true, api.StatusFailed: true, api.StatusKilled: true}

func (h *Handler) listRuns(ctx context.Context, c echo.Context) (any, error) {
	limit, err := intParam(c, "limit", 50, 1, 1000)
	if err != nil {
		return nil, err
	}
	offset, err := intParam(c, "offset", 0, 0, 1<<31-1)
	if err != nil {
		return nil, err
	}
	f := store.RunFilter{
		Project: c.QueryParam("project"), Status: c.QueryParam("status"),
		Tag: c.QueryParam("tag"), Sweep: c.QueryParam("sweep"),
		Limit: int(limit), Offset: int(offset),
	}
	if f.Status != "" && !runStatuses[f.Status] {
		return nil, bad("status", "want running, finished, failed or killed, got %q", f.Status)
	}
	rows, total, err := h.store.ListRuns(ctx, f)
	if err != nil {
		return nil, err
	}
	out := api.RunList{Runs: []api.RunSummary{}, Total: total, Limit: int(limit), Offset: int(offset)}
	sums, _, err := h.summaries(ctx, rows)
	if err != nil {
		return nil, err
	}
	for _, s := range sums {
		out.Runs = append(out.Runs, *s)
	}
	return out, nil
}

func (h *Handler) getRun(ctx context.Context, c echo.Context) (any, error) {
	r, err := h.run(ctx, c)
	if err != nil {
		return nil, err
	}
	// The lag is read before the run's figures: they are at least as
	// fresh as it says.
	lag, err := h.replicaLag(ctx, c, r)
	if err != nil {
		return nil, err
	}
	s, st, err := h.summary(ctx, r)
	if err != nil {
		return nil, err
	}
	var meta api.RunMeta
	_ = json.Unmarshal(r.Meta, &meta)
	ranks, err := h.store.RunRanks(ctx, r.RunID)
	if err != nil {
		return nil, err
	}
	d := api.RunDetail{
		RunSummary: *s,
		Meta:       orEmpty(r.Meta), Config: orEmpty(r.Config), Params: orEmpty(r.Params), Summary: orEmpty(r.Summary),
		Command: meta.Command, GitCommit: meta.GitCommit, Versions: meta.Versions, Host: meta.Host,
		Ranks: ranks, Metrics: st.UserMetrics, ReplicaLagS: lag,
	}
	if d.OpenAlerts, err = h.store.OpenAlertCount(ctx, r.RunID); err != nil {
		return nil, err
	}
	if d.Wasted, err = h.wasted(ctx, r, ranks); err != nil {
		return nil, err
	}
	if d.Consistency, err = h.consistency(ctx, r, ranks, &d.RunSummary); err != nil {
		return nil, err
	}
	if d.Versions == nil {
		d.Versions = map[string]string{}
	}
	if d.Ranks == nil {
		d.Ranks = []int{}
	}
	if d.Metrics == nil {
		d.Metrics = []string{}
	}
	return d, nil
}

func orEmpty(b json.RawMessage) json.RawMessage {
	if len(b) == 0 {
		return json.RawMessage("{}")
	}
	return b
}

// precisionFromConfig reads fp16/bf16 "enabled" from a DeepSpeed config.
func precisionFromConfig(cfg json.RawMessage) string {
	var c struct {
		FP16 *struct{ Enabled any } `json:"fp16"`
		BF16 *struct{ Enabled any } `json:"bf16"`
	}
	if json.Unmarshal(cfg, &c) != nil {
		return ""
	}
	on := func(v any) bool { b, ok := v.(bool); return ok && b }
	switch {
	case c.FP16 != nil && on(c.FP16.Enabled):
		return "fp16"
	case c.BF16 != nil && on(c.BF16.Enabled):
		return "bf16"
	case c.FP16 != nil || c.BF16 != nil:
		return "fp32"
	}
	return ""
}

// code answers GET /runs/{id}/code: the entry script's source and the git
// diff of uncommitted changes sent with the run; an empty object when none
// were (capture off, or an imported run).
func (h *Handler) code(ctx context.Context, c echo.Context) (any, error) {
	id := c.Param("id")
	raw, err := h.store.RunCode(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, &notFound{what: fmt.Sprintf("run %q", id)}
	}
	if err != nil {
		return nil, err
	}
	out := api.RunCodeResponse{RunID: id}
	if len(raw) > 0 {
		var rc api.RunCode
		if err := json.Unmarshal(raw, &rc); err != nil {
			return nil, fmt.Errorf("query: code of run %s: %w", id, err)
		}
		out.RunCode = rc
	}
	return out, nil
}

// wasted computes the wasted GPU-hours of run r, whose ranks the caller
// has read (an index skip over 1,024 ranks is tens of milliseconds), with
// the detectors' default thresholds.
func (h *Handler) wasted(ctx context.Context, r *store.RunRow, ranks []int) (api.WastedGPUHours, error) {
	w, err := h.store.WastedGPUHoursOfRanks(ctx, r.RunID, ranks, r.Status == "running", time.Now(), store.DefaultWasteRules)
	return wastedAPI(w), err
}

// wastedOf is Handler.wasted of a run whose ranks its summary s counts:
// the summary's own figure for a run that has finished.
func (h *Handler) wastedOf(ctx context.Context, r *store.RunRow, s *store.SteadySummary) (store.Wasted, error) {
	if s.Wasted != nil && r.Status != api.StatusRunning {
		return *s.Wasted, nil
	}
	return h.store.WastedGPUHoursOf(ctx, r.RunID, s.Ranks, s.LowestRank, r.Status == "running", time.Now(), store.DefaultWasteRules)
}

func wastedAPI(w store.Wasted) api.WastedGPUHours {
	return api.WastedGPUHours{Idle: api.Float(w.IdleGPUH), Straggler: api.Float(w.StragglerGPUH),
		Stalled: api.Float(w.StalledGPUH), Skipped: api.Float(w.SkippedGPUH), Total: api.Float(w.TotalGPUH)}
}
