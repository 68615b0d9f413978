package query

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
)

// The rows of compare (see docs/compare.md for what each column means and
// where it comes from). compareRows reads what the rows of a page of runs
// need, each kind of read for every run together, and compareRowOf is the
// one definition of a row, computed from what was read for it; a run
// compared alone is a page of one.

// compareReads is what was read for one run's compare row besides its
// steady-state summary: its GPU samples (and where they come from), the
// CPU use of its hosts (and where from), its whole-run figures, its
// evaluations and its wasted GPU-hours.
type compareReads struct {
	gpu    *store.GPUSampleStats
	gpuSrc string
	hosts  []string
	cpu    *store.HostCPUStats
	cpuSrc string
	stats  *store.RunStats
	evals  *store.EvalStats
	wasted store.Wasted
}

// compareRows computes the compare rows of runs, in their order: step
// time, steps/s (steps advanced per second of wall clock between the
// first and last steady step, averaged over ranks) and samples/s (the
// ranks' throughput summed) from the steps; GPU memory and utilisation
// from the steps where the sender measured them per step, else from the
// collector's GPU samples; CPU utilisation from the host samples of the
// run's nodes. A run too short for any sample to fall in its steady state
// keeps its figures from the nearest readings, as Sources and Note say.
// The steady-state summaries, whole-run figures, evaluations, hosts and
// their CPU use are read for every run together; a summary computed
// afresh and GPU samples a summary does not hold are read run by run, a
// running run's wasted GPU-hours run by run, compareWastedReaders at once.
// compareWastedReaders is how many runs' wasted GPU-hours one compare
// reads at once: a share of the pool's connections (eight at least).
const compareWastedReaders = 4

func (h *Handler) compareRows(ctx context.Context, runs []*store.RunRow) ([]api.CompareRow, error) {
	out := make([]api.CompareRow, len(runs))
	if len(runs) == 0 {
		return out, nil
	}
	ids := make([]string, len(runs))
	metas := make([]api.RunMeta, len(runs))
	for i, r := range runs {
		ids[i] = r.RunID
		_ = json.Unmarshal(r.Meta, &metas[i])
	}
	sums, err := h.compareSteadies(ctx, ids)
	if err != nil {
		return nil, err
	}
	reads := make([]compareReads, len(runs))
	stats, err := h.store.RunStatsOf(ctx, ids)
	if err != nil {
		return nil, err
	}
	evals, err := h.store.EvalStatsOf(ctx, ids)
	if err != nil {
		return nil, err
	}
	// A running run's wasted GPU-hours are six statements of its own:
	// several runs' at once, each on a connection of its own.
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(compareWastedReaders)
	for i, r := range runs {
		sum := sums[r.RunID]
		reads[i].stats, reads[i].evals = stats[r.RunID], evals[r.RunID]
		g.Go(func() (err error) {
			reads[i].wasted, err = h.wastedOf(gctx, r, &sum)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	if err := h.readMeasured(ctx, runs, metas, sums, reads); err != nil {
		return nil, err
	}
	for i, r := range runs {
		sum := sums[r.RunID]
		out[i] = compareRowOf(r, metas[i], &sum, &reads[i])
	}
	return out, nil
}

// readMeasured reads what fillMeasured needs of each run with steps whose
// steady steps lacked a figure: its GPU samples in the steady window, else
// outside it (from its summary where it holds them), its hosts and their
// CPU use in the window, else just outside it.
func (h *Handler) readMeasured(ctx context.Context, runs []*store.RunRow, metas []api.RunMeta, sums map[string]store.SteadySummary, reads []compareReads) error {
	var windows []store.RunWindow
	for i, r := range runs {
		s := sums[r.RunID]
		if s.Ranks == 0 {
			continue
		}
		var probe api.CompareRow
		fillSteady(&probe, &s, metas[i])
		if probe.GPUMemMeanMB == nil || probe.GPUUtilPct == nil {
			g, src, err := h.gpuOf(ctx, r.RunID, &s)
			if err != nil {
				return err
			}
			reads[i].gpu, reads[i].gpuSrc = g, src
		}
		windows = append(windows, store.RunWindow{RunID: r.RunID,
			From: s.WindowFrom.Add(-api.CompareNearWindow), To: s.WindowTo.Add(api.CompareNearWindow)})
	}
	if len(windows) == 0 {
		return nil
	}
	hosts, err := h.store.RunHostsOf(ctx, windows)
	if err != nil {
		return err
	}
	var in []store.HostsWindow
	at := map[string]int{}
	for i, r := range runs {
		s := sums[r.RunID]
		if s.Ranks == 0 {
			continue
		}
		at[r.RunID] = i
		reads[i].hosts = hosts[r.RunID]
		if len(reads[i].hosts) == 0 && metas[i].Host != "" {
			reads[i].hosts = []string{metas[i].Host}
		}
		in = append(in, store.HostsWindow{Key: r.RunID, Hosts: reads[i].hosts, From: s.WindowFrom, To: s.WindowTo})
	}
	cpu, err := h.store.HostCPUOf(ctx, in)
	if err != nil {
		return err
	}
	var near []store.HostsWindow
	for _, w := range in {
		i := at[w.Key]
		reads[i].cpu, reads[i].cpuSrc = cpu[w.Key], api.SourceHostSamples
		if cpu[w.Key].Samples == 0 && len(w.Hosts) > 0 {
			near = append(near, store.HostsWindow{Key: w.Key, Hosts: w.Hosts,
				From: w.From.Add(-api.CompareNearWindow), To: w.To.Add(api.CompareNearWindow)})
		}
	}
	if len(near) == 0 {
		return nil
	}
	cpu, err = h.store.HostCPUOf(ctx, near)
	if err != nil {
		return err
	}
	for _, w := range near {
		i := at[w.Key]
		reads[i].cpu, reads[i].cpuSrc = cpu[w.Key], api.SourceHostSamplesNear
	}
	return nil
}

// gpuOf returns the run's GPU samples in the steady window of its summary
// s, else, when none fell in it, over the whole run, with where they come
// from: from the summary where it holds them, else read.
func (h *Handler) gpuOf(ctx context.Context, runID string, s *store.SteadySummary) (*store.GPUSampleStats, string, error) {
	g, err := h.gpuSampleStats(ctx, runID, s.GPU, s.WindowFrom, s.WindowTo)
	if err != nil {
		return nil, "", err
	}
	if g.Samples > 0 || g.UtilSamples > 0 {
		return g, api.SourceGPUSamples, nil
	}
	if g, err = h.gpuSampleStats(ctx, runID, s.GPURun, zeroTime, zeroTime); err != nil {
		return nil, "", err
	}
	return g, api.SourceGPUSamplesRun, nil
}

// layoutOf is run r's precision and parallelism as compare and the
// regression fingerprint show them: the meta's, else the precision of
// its DeepSpeed config and data parallelism (pipeline with stages).
func layoutOf(r *store.RunRow, m api.RunMeta) (precision, parallelism string) {
	precision, parallelism = m.Precision, m.Parallelism
	if precision == "" {
		precision = precisionFromConfig(r.Config)
	}
	if parallelism == "" {
		parallelism = "data"
		if m.PipelineStages != nil && *m.PipelineStages > 1 {
			parallelism = "pipeline"
		}
	}
	return precision, parallelism
}

// compareRowOf computes the compare row of run r, of meta m, from its
// steady-state summary s and what else was read for it (see compareRows).
func compareRowOf(r *store.RunRow, m api.RunMeta, s *store.SteadySummary, rd *compareReads) api.CompareRow {
	row := api.CompareRow{RunID: r.RunID, Name: r.Name, Project: r.Project, Status: r.Status, Model: m.Model,
		ZeroStage: m.ZeroStage, PipelineStages: m.PipelineStages,
		OffloadOptim: m.OffloadOptim, OffloadParams: m.OffloadParams, MicroBatch: m.MicroBatch, WorldSize: m.WorldSize,
		Sources: map[string]string{}}
	row.Precision, row.Parallelism = layoutOf(r, m)
	if s.Ranks > 0 {
		fillSteady(&row, s, m)
		fillMeasured(&row, s, rd)
	}
	row.FinalLoss = fp(rd.stats.FinalLoss)
	row.BestEvalAcc = fp(rd.evals.BestAcc)
	if row.BestEvalAcc != nil {
		row.Sources["best_eval_accuracy"] = api.SourceEvals
	}
	for _, name := range compareFigures {
		if v := figureOf(&row, name); v != nil && row.Sources[name] == "" {
			row.Sources[name] = api.SourceSteps
		}
	}
	// Wasted GPU-hours are computed from steps and GPU samples together
	// (docs/ranks.md); they have no single source.
	w := wastedAPI(rd.wasted)
	total := w.Total
	row.Wasted, row.WastedGPUH = &w, &total
	return row
}

// fillMeasured fills GPU memory and utilisation the steps lacked from the
// GPU samples attributed to the run in the steady window, else from those
// outside it, else (memory) from the hook's allocator peaks; and CPU
// utilisation from the host samples of the run's nodes in the window,
// else just outside it, else from the steps' own cpu_util_pct.
func fillMeasured(row *api.CompareRow, s *store.SteadySummary, rd *compareReads) {
	from, to := s.WindowFrom, s.WindowTo
	var notes []string
	if g, src := rd.gpu, rd.gpuSrc; g != nil {
		if src == api.SourceGPUSamplesRun && (g.Samples > 0 || g.UtilSamples > 0) {
			notes = append(notes, fmt.Sprintf("no GPU sample fell in the steady state (%s): GPU figures from the run's %d samples outside it",
				fmtSpan(from, to), max(g.Samples, g.UtilSamples)))
		}
		if row.GPUMemMeanMB == nil && g.Samples > 0 {
			row.GPUMemMeanMB = fp(scale(g.MeanMemBytes, 1e-6))
			row.GPUMemPeakMB = fp(scale(g.PeakMemBytes, 1e-6))
			row.Sources["gpu_mem_mean_mb"], row.Sources["gpu_mem_peak_mb"] = src, src
		}
		if row.GPUUtilPct == nil && g.UtilSamples > 0 {
			row.GPUUtilPct = fp(g.MeanUtil)
			row.Sources["gpu_util_pct"] = src
		}
	}
	if row.GPUMemMeanMB == nil {
		src, v := api.SourceHookReserved, s.ReservedPeakGB
		if v == nil {
			src, v = api.SourceHookAllocated, s.AllocPeakGB
		}
		if v != nil {
			row.GPUMemMeanMB, row.GPUMemPeakMB = fp(scale(v, 1000)), fp(scale(v, 1000))
			row.Sources["gpu_mem_mean_mb"], row.Sources["gpu_mem_peak_mb"] = src, src
			what := "reserved"
			if src == api.SourceHookAllocated {
				what = "allocated"
			}
			notes = append(notes, "no GPU sample of the run: GPU memory is the hook's allocator peak ("+what+"), below NVML's by the CUDA context")
		}
	}
	if row.GPUUtilPct == nil {
		notes = append(notes, "no GPU sample of the run: no GPU utilisation")
	}
	fillHostCPU(row, s, rd, &notes)
	row.Note = strings.Join(notes, "; ")
}

// fillHostCPU sets the CPU column: the host's CPU utilisation on the
// run's nodes (see fillMeasured).
func fillHostCPU(row *api.CompareRow, s *store.SteadySummary, rd *compareReads, notes *[]string) {
	if c := rd.cpu; c != nil && c.Samples > 0 {
		if rd.cpuSrc == api.SourceHostSamplesNear {
			*notes = append(*notes, fmt.Sprintf("no host sample fell in the steady state: CPU utilisation from %d host samples within %v of it",
				c.Samples, api.CompareNearWindow))
		}
		row.CPUUtilPct = fp(c.MeanPct)
		row.Sources["cpu_util_pct"] = rd.cpuSrc
		return
	}
	if v := s.CPUUtil; v != nil {
		row.CPUUtilPct = fp(v)
		row.Sources["cpu_util_pct"] = api.SourceSteps
		*notes = append(*notes, "no host sample of the run's nodes: CPU utilisation is the cpu_util_pct the steps carried")
		return
	}
	*notes = append(*notes, "no host sample of the run's nodes: no CPU utilisation")
}

// gpuSampleStats is known when its summary holds it, else the run's GPU
// samples in [from, to].
func (h *Handler) gpuSampleStats(ctx context.Context, runID string, known *store.GPUSampleStats, from, to time.Time) (*store.GPUSampleStats, error) {
	if known != nil {
		return known, nil
	}
	return h.store.GPUSampleStats(ctx, runID, from, to)
}

// fmtSpan prints a time range as its length.
func fmtSpan(from, to time.Time) string {
	return fmt.Sprintf("%.3g s", to.Sub(from).Seconds())
}
