package query

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
)

// runLedger answers GET /runs/{id}/ledger: the GPU-hours the run lost,
// by cause (docs/ledger.md).
func (h *Handler) runLedger(ctx context.Context, c echo.Context) (any, error) {
	r, err := h.run(ctx, c)
	if err != nil {
		return nil, err
	}
	return h.ledgerOf(ctx, r, profileCache{}, time.Now())
}

// projectLedger answers GET /ledger?project=…: the ledgers of the
// project's newest runs (every project's without project=) (limit, at most 50) and their sums by cause and
// by day. The runs share their baselines' profiles within the request.
func (h *Handler) projectLedger(ctx context.Context, c echo.Context) (any, error) {
	project := c.QueryParam("project")
	limit, err := intParam(c, "limit", 20, 1, 50)
	if err != nil {
		return nil, err
	}
	runs, _, err := h.store.ListRuns(ctx, store.RunFilter{Project: project, Limit: int(limit)})
	if err != nil {
		return nil, err
	}
	out := api.ProjectLedger{Project: project, ByCause: map[string]api.Float{}, Days: []api.LedgerDay{}, Runs: []api.Ledger{}}
	pc, now := profileCache{}, time.Now()
	days := map[string]*api.LedgerDay{}
	for _, r := range runs {
		l, err := h.ledgerOf(ctx, r, pc, now)
		if err != nil {
			return nil, err
		}
		out.Runs = append(out.Runs, *l)
		out.GPUHours += l.GPUHours
		out.LostGPUH += l.LostGPUH
		day := "unknown"
		if r.StartedAt != nil {
			day = r.StartedAt.UTC().Format("2006-01-02")
		}
		d := days[day]
		if d == nil {
			d = &api.LedgerDay{Day: day, ByCause: map[string]api.Float{}}
			days[day] = d
		}
		d.GPUHours += l.GPUHours
		for _, it := range l.Items {
			out.ByCause[it.Cause] += it.GPUH
			d.ByCause[it.Cause] += it.GPUH
		}
	}
	for _, d := range days {
		out.Days = append(out.Days, *d)
	}
	sortDays(out.Days)
	return out, nil
}

func sortDays(d []api.LedgerDay) {
	for i := 1; i < len(d); i++ {
		for j := i; j > 0 && d[j].Day < d[j-1].Day; j-- {
			d[j], d[j-1] = d[j-1], d[j]
		}
	}
}

// ledgerOf computes a run's ledger. Each cause takes at most what the
// causes before it left of the run's GPU-hours, so the items never sum
// past them (see docs/ledger.md for each formula).
func (h *Handler) ledgerOf(ctx context.Context, r *store.RunRow, pc profileCache, now time.Time) (*api.Ledger, error) {
	out := &api.Ledger{RunID: r.RunID, Project: r.Project, Items: []api.LedgerItem{}}
	if r.StartedAt != nil {
		t := api.Time{Time: *r.StartedAt}
		out.StartedAt = &t
	}
	if err := h.refreshRollups(ctx, r.RunID); err != nil {
		return nil, err
	}
	ranks, err := h.store.RunRanks(ctx, r.RunID)
	if err != nil || len(ranks) == 0 {
		return out, err
	}
	first, last, ok, err := h.store.StepTimeSpan(ctx, r.RunID, ranks[0])
	if err != nil || !ok {
		return out, err
	}
	running := r.Status == "running"
	if running && now.After(last) {
		last = now
	}
	prof, err := h.profileOf(ctx, r, pc)
	if err != nil {
		return nil, err
	}
	stepMS := 0.0
	if prof.ok && prof.p.StepMS != nil {
		stepMS = *prof.p.StepMS
	}
	n := float64(len(ranks))
	// The run's first step ends one step after the run began.
	out.GPUHours = api.Float(n * (last.Sub(first).Hours() + stepMS/msPerHour))
	left := float64(out.GPUHours)
	add := func(cause string, v float64, how string) {
		v = math.Max(0, math.Min(v, left))
		left -= v
		out.Items = append(out.Items, api.LedgerItem{Cause: cause, GPUH: api.Float(v), How: how})
		out.LostGPUH += api.Float(v)
	}
	w, err := h.store.WastedGPUHours(ctx, r.RunID, running, now, store.DefaultWasteRules)
	if err != nil {
		return nil, err
	}
	// Restarts: the steps from each resumed-from checkpoint to the
	// restart, recomputed, and the time the run was down.
	restart, restartStalled, err := h.restarts(ctx, r.RunID, ranks[0], n, stepMS)
	if err != nil {
		return nil, err
	}
	add(api.LostRestarts, restart, "for each resume event (step k): ranks × (time of step k+1 − time of step k − one mean step): the recomputed steps and the downtime")
	add(api.LostStalled, w.StalledGPUH-restartStalled, fmt.Sprintf("ranks × Σ (gap − median step) over gaps between steps longer than max(%v, %g × median step), "+
		"a running run's silence included; gaps of restarts left out", store.DefaultWasteRules.StallMin, store.DefaultWasteRules.StallSteps))
	add(api.LostIdle, w.IdleGPUH, fmt.Sprintf("Σ over GPU samples below %g %% utilisation of the time to the GPU's next sample (at most a minute), outside stalls",
		store.DefaultWasteRules.IdleUtilPct))
	add(api.LostSkipped, w.SkippedGPUH, "ranks × Σ step time over skipped (overflow) steps")
	// Throttling: the throttled share of GPU time × the clock it cost.
	thr := 0.0
	g := prof.p.GPU
	if g.Samples > 0 && g.ThrottledClockMHz != nil && g.FreeClockMHz != nil && *g.FreeClockMHz > 0 {
		loss := math.Max(0, 1 - *g.ThrottledClockMHz / *g.FreeClockMHz)
		thr = float64(out.GPUHours) * g.ThrottlePct / 100 * loss
	}
	// Stragglers: the waits in collectives beyond the last rank's, split
	// by the own-work cause of the ranks named (weighted by their delay);
	// what no named rank explains is the collectives' own.
	split, hidden, err := h.stragglerSplit(ctx, r, ranks)
	if err != nil {
		return nil, err
	}
	// Collectives that block the host (gloo) hide the waiting ranks' wait
	// inside their own phases, where the collective's wait does not show
	// it: the own-work signal's hidden waits count it instead.
	strag := math.Max(w.StragglerGPUH, hidden)
	gpuStrag := strag * split["gpu"]
	// A throttled GPU's straggling is the throttling's.
	thrInStrag := math.Min(thr, gpuStrag)
	howStrag := "the larger of Σ over steps of Σ_r (wait_r − min wait) in the collective and Σ_r the rank's wait hidden in its own phases " +
		"(hidden_wait_ms × steps, collectives that block the host) with the own excess of the ranks named by their own work, × the share of the named stragglers' delay whose own-work cause is "
	add(api.LostStragglerData, strag*split["data"], howStrag+"data")
	add(api.LostStragglerHost, strag*split["host"], howStrag+"host")
	add(api.LostStragglerGPU, gpuStrag-thrInStrag, howStrag+"gpu, less what throttling explains")
	add(api.LostStragglerComm, strag*split["comm"], "the collective waits no named straggler explains")
	add(api.LostThrottling, thr, "GPU-hours × the share of GPU samples with a thermal, power or slowdown reason × (1 − mean SM clock throttled / unthrottled)")
	reg := 0.0
	if prof.ok {
		rg, err := h.compareWithBaseline(ctx, r, nil, "", h.alertsConfig().WithMeta(r.Meta), pc)
		if err != nil {
			return nil, err
		}
		for _, f := range rg.Figures {
			if f.Name == "step_time_ms" && f.Worse && f.Value != nil && f.BaselineMean != nil && *f.Value > 0 {
				steady := n * prof.to.Sub(prof.from).Hours()
				reg = steady*(1-float64(*f.BaselineMean)/float64(*f.Value)) - thr - strag
			}
		}
	}
	add(api.LostRegression, reg, "ranks × steady hours × (1 − baseline mean step time / the run's), when beyond the baseline's spread, less throttling and stragglers")
	return out, nil
}

const msPerHour = 3.6e6

// restarts returns the GPU-hours lost to restarts (api.EventResume
// events) and the part of them the stall figure holds.
func (h *Handler) restarts(ctx context.Context, runID string, rank int, n, stepMS float64) (lost, stalled float64, err error) {
	steps, err := h.store.ResumeEvents(ctx, runID)
	if err != nil {
		return 0, 0, err
	}
	limit := max(store.DefaultWasteRules.StallMin, time.Duration(store.DefaultWasteRules.StallSteps*stepMS*float64(time.Millisecond)))
	for _, k := range steps {
		a, ok1, err := h.store.StepTimeAt(ctx, runID, rank, k)
		if err != nil {
			return 0, 0, err
		}
		b, ok2, err := h.store.StepTimeAt(ctx, runID, rank, k+1)
		if err != nil {
			return 0, 0, err
		}
		if !ok1 || !ok2 || !b.After(a) {
			continue
		}
		gap := b.Sub(a)
		v := n * (float64(gap.Milliseconds()) - stepMS) / msPerHour
		lost += v
		if gap > limit {
			stalled += v
		}
	}
	return lost, stalled, nil
}

// stragglerSplit returns the shares (summing to 1) of the straggler
// waits by cause: data, host and gpu for the /ranks stragglers by their
// own-work cause, weighted by delay_ms; comm for the rest. hidden is the
// GPU-hours the ranks spent waiting inside their own phases for the
// named stragglers (Σ hidden_wait_ms × steps) and the stragglers' own
// excess (Σ own_excess_ms × steps of the ranks named by their own work).
func (h *Handler) stragglerSplit(ctx context.Context, r *store.RunRow, ranks []int) (split map[string]float64, hidden float64, err error) {
	out := map[string]float64{"comm": 1}
	if len(ranks) < 2 {
		return out, 0, nil
	}
	from, err := h.steadyFrom(ctx, r.RunID, ranks[0])
	if err != nil {
		return nil, 0, err
	}
	rep, err := h.rankReport(ctx, r, ranks, h.opt.StragglerPct, from)
	if err != nil {
		return nil, 0, err
	}
	by := map[string]float64{}
	total := 0.0
	for _, st := range rep.Ranks {
		if st.HiddenWaitMS != nil && float64(*st.HiddenWaitMS) > 0 {
			hidden += float64(*st.HiddenWaitMS) * float64(st.Steps) / msPerHour
		}
		// A straggler's own excess leaves its GPU idle as long.
		if st.Straggler && st.StragglerBy == "own_work" && st.OwnExcessMS != nil && float64(*st.OwnExcessMS) > 0 {
			hidden += float64(*st.OwnExcessMS) * float64(st.Steps) / msPerHour
		}
	}
	for _, st := range rep.Ranks {
		if !st.Straggler || st.OwnCause == "" || st.DelayMS == nil || !(float64(*st.DelayMS) > 0) {
			continue
		}
		by[st.OwnCause] += float64(*st.DelayMS)
		total += float64(*st.DelayMS)
	}
	if total == 0 {
		return out, hidden, nil
	}
	out["comm"] = 0
	for k, v := range by {
		out[k] = v / total
	}
	return out, hidden, nil
}
