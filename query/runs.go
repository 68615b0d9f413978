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
	for _, r := range rows {
		s, _, err := h.summary(ctx, r)
		if err != nil {
			return nil, err
		}
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
	if d.Wasted, err = h.wasted(ctx, r); err != nil {
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

// summary builds the summary cards of a run, refreshing its rollups first
// so that whole-run figures include the latest steps.
func (h *Handler) summary(ctx context.Context, r *store.RunRow) (*api.RunSummary, *store.RunStats, error) {
	if err := h.refreshRollups(ctx, r.RunID); err != nil {
		return nil, nil, err
	}
	st, err := h.store.RunStats(ctx, r.RunID)
	if err != nil {
		return nil, nil, err
	}
	ev, err := h.store.EvalStats(ctx, r.RunID)
	if err != nil {
		return nil, nil, err
	}
	var m api.RunMeta
	_ = json.Unmarshal(r.Meta, &m)
	s := &api.RunSummary{
		RunID: r.RunID, Project: r.Project, Name: r.Name, Status: r.Status, Tags: r.Tags, SweepID: r.SweepID,
		StartedAt: r.StartedAt, EndedAt: r.EndedAt, LastSeenAt: r.LastSeenAt,
		Model: m.Model, ParamCount: m.Params, GPU: m.GPU, ZeroStage: m.ZeroStage, Precision: m.Precision,
		MicroBatch: m.MicroBatch, GradAccum: m.GradAccum, EffectiveBatch: m.EffectiveBatch, WorldSize: m.WorldSize,
		PipelineStages: m.PipelineStages, OffloadOptim: m.OffloadOptim, OffloadParams: m.OffloadParams,
		Steps: st.Rows, LastStep: st.LastStep, FinalLoss: fp(st.FinalLoss),
		BestValAccuracy: fp(ev.BestAcc), FinalValAccuracy: fp(ev.FinalAcc), BestValF1: fp(ev.BestF1),
		FinalValF1: fp(ev.FinalF1), FinalValLoss: fp(ev.FinalLoss),
		MeanThroughputSPS: fp(st.MeanThroughpt), MeanGPUUtilPct: fp(st.MeanGPUUtil), PeakGPUMemGB: fp(st.PeakGPUMemGB),
		PeakGPUMemAllocGB: fp(st.AllocPeakGB),
		MeanStepMS:        fp(st.MeanStepMS), MeanTFLOPS: fp(st.MeanTFLOPS), MeanMFU: fp(st.MeanMFU), SkippedSteps: st.Skipped,
	}
	if s.Tags == nil {
		s.Tags = []string{}
	}
	if s.EffectiveBatch == nil && m.MicroBatch != nil {
		e := *m.MicroBatch
		if m.GradAccum != nil {
			e *= *m.GradAccum
		}
		if m.WorldSize != nil {
			dp := *m.WorldSize
			if m.PipelineStages != nil && *m.PipelineStages > 1 {
				dp /= *m.PipelineStages
			}
			e *= max(dp, 1)
		}
		s.EffectiveBatch = &e
	}
	if s.Precision == "" {
		s.Precision = precisionFromConfig(r.Config)
	}
	end := r.EndedAt
	if end == nil {
		end = r.LastSeenAt
	}
	if r.StartedAt != nil && end != nil {
		s.DurationS = fv(end.Sub(*r.StartedAt).Seconds())
	}
	s.TotalSteps = m.TotalSteps
	s.RollupLag = rollupLag(ctx, r.RunID)
	if err := h.fillFromGPUSamples(ctx, r.RunID, s); err != nil {
		return nil, nil, err
	}
	if err := h.estimateFinish(ctx, r, s); err != nil {
		return nil, nil, err
	}
	return s, st, nil
}

// fillFromGPUSamples takes the GPU figures of the summary from the NVML
// samples the collectors attributed to the run: its peak memory in use
// (the higher of the samples' and the steps'), and its mean utilisation
// where the steps carried none (the hook does not send it).
func (h *Handler) fillFromGPUSamples(ctx context.Context, runID string, s *api.RunSummary) error {
	g, err := h.store.GPUSampleStats(ctx, runID, zeroTime, zeroTime)
	if err != nil {
		return err
	}
	if s.MeanGPUUtilPct == nil && g.UtilSamples > 0 {
		s.MeanGPUUtilPct = fp(g.MeanUtil)
	}
	if g.PeakMemBytes != nil && (s.PeakGPUMemGB == nil || *g.PeakMemBytes/1e9 > float64(*s.PeakGPUMemGB)) {
		s.PeakGPUMemGB = fv(*g.PeakMemBytes / 1e9)
	}
	return nil
}

// estimateFinish sets the time a running run with known total steps has
// left: the steps left times the steady-state mean step time of its first
// rank (the wall-clock time per step over the steady steps when they
// carry no step time), counted from the run's last record; none for a run
// silent past the stall alert's limit.
func (h *Handler) estimateFinish(ctx context.Context, r *store.RunRow, s *api.RunSummary) error {
	if r.Status != api.StatusRunning || s.TotalSteps == nil || s.LastStep == nil {
		return nil
	}
	left := max(*s.TotalSteps-*s.LastStep, 0)
	var stepS *float64
	if left > 0 {
		ranks, err := h.store.RunRanks(ctx, r.RunID)
		if err != nil || len(ranks) == 0 {
			return err
		}
		from, err := h.steadyFrom(ctx, r.RunID, ranks[0])
		if err != nil {
			return err
		}
		agg, err := h.steadyRanks(ctx, r.RunID, from, ranks[0])
		if err != nil {
			return err
		}
		if len(agg) == 0 {
			return nil
		}
		a := agg[0]
		switch d := a.LastTime.Sub(a.FirstTime).Seconds(); {
		case a.StepMS != nil && finite(*a.StepMS) && *a.StepMS > 0:
			v := *a.StepMS / 1000
			stepS = &v
		case a.LastStep > a.FirstStep && d > 0:
			v := d / float64(a.LastStep-a.FirstStep)
			stepS = &v
		default:
			return nil
		}
	} else {
		stepS = new(float64)
	}
	// A run silent for longer than the stall alert's limit may never
	// finish: its time left is unknown, not the steps left at its old pace.
	if at := r.LastSeenAt; at != nil && left > 0 {
		cfg := h.alertsConfig().WithMeta(r.Meta)
		limit := max(time.Duration(cfg.StallMin), time.Duration(cfg.StallSteps**stepS*float64(time.Second)))
		if time.Since(*at) > limit {
			return nil
		}
	}
	eta := float64(left) * *stepS
	s.ETASeconds = fv(eta)
	if at := r.LastSeenAt; at != nil {
		t := at.Add(time.Duration(eta * float64(time.Second))).UTC()
		s.ETAAt = &t
	}
	return nil
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

// wasted computes a run's wasted GPU-hours with the detectors' default
// thresholds.
func (h *Handler) wasted(ctx context.Context, r *store.RunRow) (api.WastedGPUHours, error) {
	w, err := h.store.WastedGPUHours(ctx, r.RunID, r.Status == "running", time.Now(), store.DefaultWasteRules)
	return wastedAPI(w), err
}

// wastedOf is Handler.wasted of a run whose ranks its summary s counts:
// the summary's own figure for a run that has finished.
func (h *Handler) wastedOf(ctx context.Context, r *store.RunRow, s *store.SteadySummary) (api.WastedGPUHours, error) {
	if s.Wasted != nil && r.Status != api.StatusRunning {
		return wastedAPI(*s.Wasted), nil
	}
	w, err := h.store.WastedGPUHoursOf(ctx, r.RunID, s.Ranks, s.LowestRank, r.Status == "running", time.Now(), store.DefaultWasteRules)
	return wastedAPI(w), err
}

func wastedAPI(w store.Wasted) api.WastedGPUHours {
	return api.WastedGPUHours{Idle: api.Float(w.IdleGPUH), Straggler: api.Float(w.StragglerGPUH),
		Stalled: api.Float(w.StalledGPUH), Skipped: api.Float(w.SkippedGPUH), Total: api.Float(w.TotalGPUH)}
}
