package query

import (
	"context"
	"encoding/json"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
)

// Run summaries (api.RunSummary): the cards of a run's page and the rows
// of the runs list, a sweep's runs among them. summaryOf is the one
// definition of a summary, computed from what was read for it; summaries
// reads that for a whole page of runs in a few statements whatever its
// size, and a run's own summary is the summary of a page of one.

// summary builds the summary cards of a run, refreshing its rollups first
// so that whole-run figures include the latest steps, and returns its
// whole-run figures with it.
func (h *Handler) summary(ctx context.Context, r *store.RunRow) (*api.RunSummary, *store.RunStats, error) {
	sums, stats, err := h.summaries(ctx, []*store.RunRow{r})
	if err != nil {
		return nil, nil, err
	}
	return sums[0], stats[r.RunID], nil
}

// summaries builds the summaries of runs, in their order, refreshing their
// rollups first, and returns their whole-run figures by run. Each read
// covers every run of the page.
func (h *Handler) summaries(ctx context.Context, runs []*store.RunRow) ([]*api.RunSummary, map[string]*store.RunStats, error) {
	if len(runs) == 0 {
		return nil, map[string]*store.RunStats{}, nil
	}
	ids := make([]string, len(runs))
	for i, r := range runs {
		ids[i] = r.RunID
	}
	if err := h.refreshRollupsOf(ctx, ids); err != nil {
		return nil, nil, err
	}
	stats, err := h.store.RunStatsOf(ctx, ids)
	if err != nil {
		return nil, nil, err
	}
	evals, err := h.store.EvalStatsOf(ctx, ids)
	if err != nil {
		return nil, nil, err
	}
	gpus, err := h.store.GPUSampleStatsOf(ctx, ids, zeroTime, zeroTime)
	if err != nil {
		return nil, nil, err
	}
	out := make([]*api.RunSummary, len(runs))
	for i, r := range runs {
		out[i] = summaryOf(r, stats[r.RunID], evals[r.RunID], gpus[r.RunID], rollupLag(ctx, r.RunID))
	}
	if err := h.estimateFinishes(ctx, runs, out); err != nil {
		return nil, nil, err
	}
	return out, stats, nil
}

// summaryOf computes the summary of run r from its whole-run figures st,
// its evaluations' ev, its GPU samples' g and its rollups' lag, all but the
// estimate of its finish (estimateFinishes).
func summaryOf(r *store.RunRow, st *store.RunStats, ev *store.EvalStats, g *store.GPUSampleStats, lag *api.RollupLag) *api.RunSummary {
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
	s.RollupLag = lag
	fillFromGPUSamples(s, g)
	return s
}

// fillFromGPUSamples takes the GPU figures of the summary from the NVML
// samples the collectors attributed to the run: its peak memory in use
// (the higher of the samples' and the steps'), and its mean utilisation
// where the steps carried none (the hook does not send it).
func fillFromGPUSamples(s *api.RunSummary, g *store.GPUSampleStats) {
	if s.MeanGPUUtilPct == nil && g.UtilSamples > 0 {
		s.MeanGPUUtilPct = fp(g.MeanUtil)
	}
	if g.PeakMemBytes != nil && (s.PeakGPUMemGB == nil || *g.PeakMemBytes/1e9 > float64(*s.PeakGPUMemGB)) {
		s.PeakGPUMemGB = fv(*g.PeakMemBytes / 1e9)
	}
}

// stepsLeft is how many steps the running run r of summary s has left,
// when it says how many it will take.
func stepsLeft(r *store.RunRow, s *api.RunSummary) (int64, bool) {
	if r.Status != api.StatusRunning || s.TotalSteps == nil || s.LastStep == nil {
		return 0, false
	}
	return max(*s.TotalSteps-*s.LastStep, 0), true
}

// estimateFinishes sets the time each running run of runs (sums[i] the
// summary of runs[i]) with known total steps has left: the steps left
// times the steady-state mean step time of its first rank (the wall-clock
// time per step over the steady steps when they carry no step time),
// counted from the run's last record; none for a run silent past the
// stall alert's limit. The step times of the runs with steps left are
// read together (stepTimes).
func (h *Handler) estimateFinishes(ctx context.Context, runs []*store.RunRow, sums []*api.RunSummary) error {
	var need []*store.RunRow
	for i, r := range runs {
		if left, ok := stepsLeft(r, sums[i]); ok && left > 0 {
			need = append(need, r)
		}
	}
	stepS := map[string]float64{}
	if len(need) > 0 {
		var err error
		if stepS, err = h.stepTimes(ctx, need); err != nil {
			return err
		}
	}
	for i, r := range runs {
		left, ok := stepsLeft(r, sums[i])
		if !ok {
			continue
		}
		per := 0.0
		if left > 0 {
			if per, ok = stepS[r.RunID]; !ok {
				continue
			}
		}
		h.setFinish(r, sums[i], left, per)
	}
	return nil
}

// setFinish sets the estimate of the finish of running run r, of summary
// s, with left steps left at stepS seconds a step.
func (h *Handler) setFinish(r *store.RunRow, s *api.RunSummary, left int64, stepS float64) {
	// A run silent for longer than the stall alert's limit may never
	// finish: its time left is unknown, not the steps left at its old pace.
	if at := r.LastSeenAt; at != nil && left > 0 {
		cfg := h.alertsConfig().WithMeta(r.Meta)
		limit := max(time.Duration(cfg.StallMin), time.Duration(cfg.StallSteps*stepS*float64(time.Second)))
		if time.Since(*at) > limit {
			return
		}
	}
	eta := float64(left) * stepS
	s.ETASeconds = fv(eta)
	if at := r.LastSeenAt; at != nil {
		t := at.Add(time.Duration(eta * float64(time.Second))).UTC()
		s.ETAAt = &t
	}
}

// stepTimes returns the steady-state time a step takes, in seconds, of
// the first rank of each of runs (whose rollups were just refreshed),
// where it is known: the mean step time of its steps from its steady
// state's first step on (steadyStart), from the raw rows (at most
// store.ExactRankRows of them) or the rollups, else the wall-clock time
// per step over those steps.
func (h *Handler) stepTimes(ctx context.Context, runs []*store.RunRow) (map[string]float64, error) {
	ids := make([]string, len(runs))
	for i, r := range runs {
		ids[i] = r.RunID
	}
	lowest, err := h.store.LowestRanks(ctx, ids)
	if err != nil {
		return nil, err
	}
	var first []store.RankFrom
	for _, id := range ids {
		if rank, ok := lowest[id]; ok {
			first = append(first, store.RankFrom{RunID: id, Rank: rank})
		}
	}
	out := map[string]float64{}
	if len(first) == 0 {
		return out, nil
	}
	pts, err := h.store.StepMSTimelines(ctx, first, store.RawRankSteps)
	if err != nil {
		return nil, err
	}
	for i := range first {
		first[i].From = steadyStart(pts[first[i].RunID])
	}
	rows, err := h.store.StepRowsOf(ctx, first)
	if err != nil {
		return nil, err
	}
	var raw, rolled []store.RankFrom
	for _, x := range first {
		if rows[x.RunID] > store.ExactRankRows {
			rolled = append(rolled, x)
		} else {
			raw = append(raw, x)
		}
	}
	agg, err := h.store.StepTimesFrom(ctx, raw, rolled)
	if err != nil {
		return nil, err
	}
	for id, a := range agg {
		switch d := a.LastTime.Sub(a.FirstTime).Seconds(); {
		case a.StepMS != nil && finite(*a.StepMS) && *a.StepMS > 0:
			out[id] = *a.StepMS / 1000
		case a.LastStep > a.FirstStep && d > 0:
			out[id] = d / float64(a.LastStep-a.FirstStep)
		}
	}
	return out, nil
}
