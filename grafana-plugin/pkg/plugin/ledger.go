package plugin

import (
	"context"
	"fmt"
	"net/url"
	"strconv"

	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/api"
)

// ledgerQuery is the GPU-hours lost by cause (docs/regression.md): for
// the query's runs, GET /runs/{id}/ledger of each, a column per run; for
// none, GET /ledger of the project's newest runs (every project's for
// All), a column for them all and one per day of the runs' start.
var ledgerQuery = queryFunc(func(ctx context.Context, d *Datasource, r request) (data.Frames, error) {
	runs := compareRuns(r.PluginQuery)
	if len(runs) > 0 {
		ledgers := make([]api.Ledger, min(len(runs), maxLedgerRuns))
		for i := range ledgers {
			if err := d.client.get(ctx, runPath(runs[i], "ledger"), nil, &ledgers[i]); err != nil {
				return nil, err
			}
		}
		f := runLedgerFrame(ledgers)
		if len(runs) > maxLedgerRuns {
			f.AppendNotices(data.Notice{Severity: data.NoticeSeverityInfo,
				Text: fmt.Sprintf("the first %d of the %d runs picked", maxLedgerRuns, len(runs))})
		}
		return data.Frames{f}, nil
	}
	p := url.Values{"limit": {strconv.Itoa(maxLedgerRuns)}}
	if project := filterValue(r.Project); project != "" {
		p.Set("project", project)
	}
	var pl api.ProjectLedger
	if err := d.client.get(ctx, "/api/v1/ledger", p, &pl); err != nil {
		return nil, err
	}
	return data.Frames{projectLedgerFrame(pl)}, nil
})

// maxLedgerRuns is the most runs one ledger query reads, the first of
// those picked: the server's limit for a project's.
const maxLedgerRuns = 50

// The ledger's first two lines, before the causes.
const (
	LedgerGPUHours = "gpu_hours"
	LedgerLost     = "lost"
)

// ledgerLines are the ledger's lines in words, the run's GPU-hours and
// all lost first, then each cause of api.LedgerCauses.
var ledgerLines = map[string]string{
	LedgerGPUHours:        "GPU-hours of the run",
	LedgerLost:            "Lost, all causes",
	api.LostRestarts:      "Restarts",
	api.LostStalled:       "Stalls and hangs",
	api.LostIdle:          "Idle GPUs",
	api.LostSkipped:       "Skipped steps",
	api.LostStragglerData: "Stragglers: data",
	api.LostStragglerHost: "Stragglers: host",
	api.LostStragglerGPU:  "Stragglers: GPU",
	api.LostStragglerComm: "Stragglers: communication",
	api.LostThrottling:    "Throttling",
	api.LostRegression:    "Regression against the baseline",
}

// ledgerTotalsHow says how the first two lines are counted; each cause's
// line says its own, as the server computed it.
var ledgerTotalsHow = map[string]string{
	LedgerGPUHours: "ranks × (last step − first step + one mean step), to now while the run runs",
	LedgerLost:     "the causes below together: each takes at most what the causes before it left, so they never pass the GPU-hours",
}

// ledgerColumn is one value column of a ledger table: a run, or a
// project's runs together or of one day.
type ledgerColumn struct {
	name, display string
	gpuHours      api.Float
	lost          *api.Float
	byCause       map[string]api.Float
}

func runLedgerFrame(ls []api.Ledger) *data.Frame {
	cols := make([]ledgerColumn, len(ls))
	for i, l := range ls {
		by := make(map[string]api.Float, len(l.Items))
		for _, it := range l.Items {
			by[it.Cause] = it.GPUH
		}
		cols[i] = ledgerColumn{name: "run." + l.RunID, display: l.RunID, gpuHours: l.GPUHours, lost: &ls[i].LostGPUH, byCause: by}
	}
	return ledgerFrame(cols, ledgerHow(ls))
}

func projectLedgerFrame(pl api.ProjectLedger) *data.Frame {
	display := fmt.Sprintf("All %d runs", len(pl.Runs))
	cols := []ledgerColumn{{name: "all", display: display, gpuHours: pl.GPUHours, lost: &pl.LostGPUH, byCause: pl.ByCause}}
	for _, d := range pl.Days {
		cols = append(cols, ledgerColumn{name: "day." + d.Day, display: d.Day, gpuHours: d.GPUHours, byCause: d.ByCause})
	}
	f := ledgerFrame(cols, ledgerHow(pl.Runs))
	if len(pl.Runs) == 0 {
		f.AppendNotices(data.Notice{Severity: data.NoticeSeverityInfo, Text: "no runs in the project"})
	}
	return f
}

// ledgerHow is how each cause was computed, as the ledgers say it.
func ledgerHow(ls []api.Ledger) map[string]string {
	how := map[string]string{}
	for _, l := range ls {
		for _, it := range l.Items {
			if how[it.Cause] == "" {
				how[it.Cause] = it.How
			}
		}
	}
	return how
}

// ledgerFrame is a row per line (GPU-hours, lost, each cause), a column
// of GPU-hours per ledger column and how each line was computed last. A
// day's lost GPU-hours are its causes' sum, which the server leaves to
// the reader: its cell is empty.
func ledgerFrame(cols []ledgerColumn, how map[string]string) *data.Frame {
	lines := append([]string{LedgerGPUHours, LedgerLost}, api.LedgerCauses...)
	fields := []*data.Field{strCol(lines, "cause", "Cause", func(l string) string { return inWords(ledgerLines, l) })}
	for _, c := range cols {
		fields = append(fields, numCol(lines, c.name, api.GPUHoursUnit, c.display, func(l string) *float64 {
			switch l {
			case LedgerGPUHours:
				return fv(c.gpuHours)
			case LedgerLost:
				return fp(c.lost)
			}
			if v, ok := c.byCause[l]; ok {
				return fv(v)
			}
			return nil
		}))
	}
	fields = append(fields, strCol(lines, "how", "How it was computed", func(l string) string {
		if h, ok := ledgerTotalsHow[l]; ok {
			return h
		}
		return how[l]
	}))
	return data.NewFrame("ledger", fields...)
}
