package dashboards_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/deepseed/deepseed/api"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/grafana/grafana-plugin-sdk-go/backend"

	"github.com/deepseed/deepseed/dashboards"
	"github.com/deepseed/deepseed/grafana-plugin/pkg/plugin"
	"github.com/deepseed/deepseed/internal/fleettest"
	"github.com/deepseed/deepseed/server/servertest"
)

// TestGPUNodesPastSixteenGPUs opens the GPU nodes dashboard on a run of
// 1,024 GPUs over 128 hosts, through the plugin, as a user would: it shows
// one host's section (no section repeated per host), the Host picker
// offers every host of the run, the fleet table lists every GPU (their
// charts' distribution has no host names, which left both empty), and
// every panel shows data or says why it has none.
func TestGPUNodesPastSixteenGPUs(t *testing.T) {
	base, readToken, ingestToken := startServer(t)
	start := time.Date(2026, 5, 4, 12, 0, 0, 0, time.UTC)
	run := fleettest.Run{ID: "fleet-gpus", Ranks: 1024, Steps: 2, Late: 7, Start: start}
	servertest.Ingest(t, base, ingestToken, run.Records())

	ctx := context.Background()
	inst, err := plugin.NewDatasource(ctx, backend.DataSourceInstanceSettings{
		UID: dashboards.DatasourceUID, Name: "DeepSeed",
		JSONData:                []byte(fmt.Sprintf(`{"url":%q}`, base)),
		DecryptedSecureJSONData: map[string]string{"token": readToken},
	})
	if err != nil {
		t.Fatal(err)
	}
	ds := inst.(*plugin.Datasource)
	raw, err := os.ReadFile(filepath.Join(jsonDir, dashboards.UIDGPUNodes+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc fullDashboard
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	timeRange := backend.TimeRange{From: start.Add(-time.Hour), To: start.Add(time.Hour)}
	tr := "&from=" + timeRange.From.Format(time.RFC3339) + "&to=" + timeRange.To.Format(time.RFC3339)
	for _, r := range []string{api.AllValue, run.ID} {
		hosts := callResource(ctx, t, ds, "hosts", "run="+r+tr)
		if len(hosts) != run.Ranks/fleettest.RanksPerHost || hosts[0].Value != run.Host(0) {
			t.Errorf("run=%s: Host offers %d hosts (first %+v), want the run's %d", r, len(hosts), hosts, run.Ranks/fleettest.RanksPerHost)
		}
	}
	for _, v := range doc.Templating.List {
		if v.Name == "host" && (v.Multi || v.IncludeAll) {
			t.Errorf("Host: multi %v, includeAll %v: All would open a section per host", v.Multi, v.IncludeAll)
		}
	}
	vars := map[string]string{"project": "fleet", "run": run.ID, "host": run.Host(0)}
	noValue := map[string]string{}
	renames := map[string]*regexp.Regexp{} // a panel's renameByRegex, by title
	for _, p := range rawPanels(t, dashboards.UIDGPUNodes) {
		title, _ := p["title"].(string)
		noValue[title] = p.str("fieldConfig", "defaults", "noValue")
		for _, tr := range anyList(p["transformations"]) {
			m, _ := tr.(map[string]any)
			if opts, _ := m["options"].(map[string]any); m["id"] == "renameByRegex" {
				re, _ := opts["regex"].(string)
				renames[title] = grafanaRegexp(t, re)
			}
		}
	}
	fleet := false
	for _, p := range doc.Panels {
		if p.Repeat != "" {
			t.Errorf("%q repeats per %s: 128 hosts make 128 sections", p.Title, p.Repeat)
		}
		if p.Type == "row" {
			continue
		}
		t.Run(p.Title, func(t *testing.T) {
			frames, err := runPanel(ctx, ds, p, vars, timeRange)
			switch {
			case errors.Is(err, errBlank):
				if noValue[p.Title] == "" {
					t.Errorf("no data and no sentence saying why")
				}
				return
			case err != nil:
				t.Fatal(err)
			}
			if p.Type == "table" && frames[0].Rows() == run.Ranks {
				fleet = true
			}
			if p.Title == "GPU utilisation" && len(frames) != fleettest.RanksPerHost {
				t.Errorf("%d series, want the %d GPUs of %s", len(frames), fleettest.RanksPerHost, run.Host(0))
			}
			// A host's charts name its GPUs without the host, so that the
			// legend's figures fit beside the chart.
			if panelUses(p, "$host") && p.Type == "timeseries" {
				re := renames[p.Title]
				for _, name := range displayNames(frames) {
					if name == "time" {
						continue
					}
					shown := name
					if re != nil {
						shown = re.ReplaceAllString(name, "$1")
					}
					if strings.Contains(shown, run.Host(0)) || !strings.HasPrefix(shown, "GPU ") {
						t.Errorf("legend entry %q (from %q): want it to start with the GPU, not the host", shown, name)
					}
				}
			}
		})
	}
	if !fleet {
		t.Errorf("no table lists the run's %d GPUs", run.Ranks)
	}
	// A time range without a sample: Grafana draws a frame of columns and
	// no rows as an empty box of headers, and says the panel's no-data
	// sentence only for a frame without fields.
	later := backend.TimeRange{From: start.Add(24 * time.Hour), To: start.Add(25 * time.Hour)}
	for _, p := range doc.Panels {
		if p.Type != "table" {
			continue
		}
		frames, err := runPanel(ctx, ds, p, vars, later)
		if err != nil && !errors.Is(err, errBlank) {
			t.Fatalf("%q a day later: %v", p.Title, err)
		}
		for _, f := range frames {
			if len(f.Fields) > 0 && f.Rows() == 0 {
				t.Errorf("%q a day later: %d columns and no rows, an empty box instead of %q", p.Title, len(f.Fields), noValue[p.Title])
			}
		}
	}
}
