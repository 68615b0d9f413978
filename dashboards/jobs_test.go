package dashboards_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/dashboards"
	"github.com/deepseed/deepseed/grafana-plugin/pkg/plugin"
)

// TestJobsPanels checks that the Jobs dashboard shows what issue 15 and
// the seed's job panels ask for: the four counters, the job table with
// its state coloured and its run linked to the Training run dashboard
// over the run's window, the quota as used against limit, and the sweep's
// trials ranked by the picked metric and goal.
func TestJobsPanels(t *testing.T) {
	panels := rawPanels(t, dashboards.UIDJobs)
	byTitle := map[string]rawPanel{}
	for _, p := range panels {
		byTitle[p.str("title")] = p
	}
	for _, c := range []struct{ title, field string }{
		{"Total", "total"}, {"Active", "active"}, {"Done", "done"}, {"Failed", "failed"},
	} {
		p, ok := byTitle[c.title]
		if !ok || p.str("type") != "stat" {
			t.Errorf("no stat panel %q", c.title)
			continue
		}
		tg := panelTargets(t, p)
		if len(tg) != 1 || tg[0].QueryType != api.QueryJobCounts || tg[0].Project != "$project" || tg[0].Sweep != "$sweep" {
			t.Errorf("%s: targets %+v, want job_counts of $project and $sweep", c.title, tg)
		}
		if fields := p.str("options", "reduceOptions", "fields"); !grafanaRegexp(t, fields).MatchString(c.field) {
			t.Errorf("%s shows fields %s, not %s", c.title, fields, c.field)
		}
	}

	for _, title := range []string{"Jobs", "Sweep trials by $metric ($goal)"} {
		p, ok := byTitle[title]
		if !ok || p.str("type") != "table" {
			t.Fatalf("no table %q", title)
		}
		overrides := map[string]map[string]any{}
		for _, o := range anyList(p.get("fieldConfig", "overrides")) {
			m := o.(map[string]any)
			name, _ := m["matcher"].(map[string]any)["options"].(string)
			props := map[string]any{}
			for _, pr := range anyList(m["properties"]) {
				pm := pr.(map[string]any)
				props[pm["id"].(string)] = pm["value"]
			}
			overrides[name] = props
		}
		// Every state has its own colour.
		b, _ := json.Marshal(overrides["State"]["mappings"])
		colours := map[string]bool{}
		for _, s := range plugin.JobStates {
			var m []struct {
				Options map[string]struct {
					Color string `json:"color"`
				} `json:"options"`
			}
			_ = json.Unmarshal(b, &m)
			if len(m) != 1 || m[0].Options[s].Color == "" || colours[m[0].Options[s].Color] {
				t.Errorf("%s: state %s has no colour of its own in %s", title, s, b)
			}
			if len(m) == 1 {
				colours[m[0].Options[s].Color] = true
			}
		}
		if overrides["Runtime"]["unit"] != "s" || overrides["GPU-hours"]["unit"] != api.GPUHoursUnit {
			t.Errorf("%s: runtime %v and GPU-hours %v not formatted", title, overrides["Runtime"], overrides["GPU-hours"])
		}
		links, _ := json.Marshal(overrides["Run"]["links"])
		for _, part := range []string{"/d/" + dashboards.UIDTrainingRun + "?", "var-run=${__value.raw}", "from=${__data.fields.run_from}",
			"to=${__data.fields.run_to}", "var-project=${__data.fields.project}"} {
			if !strings.Contains(string(links), part) {
				t.Errorf("%s: the run link %s lacks %s", title, links, part)
			}
		}
		for _, hidden := range []string{"Run from", "Run to"} {
			if overrides[hidden]["custom.hidden"] != true {
				t.Errorf("%s: %s is shown; it only feeds the run link", title, hidden)
			}
		}
	}
	trials := panelTargets(t, byTitle["Sweep trials by $metric ($goal)"])
	if len(trials) != 1 || trials[0].QueryType != api.QuerySweepTrials || trials[0].Metric != "$metric" || trials[0].Goal != "$goal" || trials[0].Sweep != "$sweep" {
		t.Errorf("sweep trials query %+v, want $sweep ranked by $metric toward $goal", trials)
	}
	jobs := panelTargets(t, byTitle["Jobs"])
	if len(jobs) != 1 || jobs[0].QueryType != api.QueryJobs || jobs[0].State != "$state" {
		t.Errorf("jobs query %+v, want filtered by $state", jobs)
	}
	quota, ok := byTitle["GPU quota"]
	if !ok || quota.str("type") != "bargauge" {
		t.Fatal("no GPU quota bar gauge")
	}
	if q := panelTargets(t, quota); len(q) != 1 || q[0].QueryType != api.QueryQuotas {
		t.Errorf("quota query %+v", q)
	}

	// Project, sweep and state offer All, which the plugin reads as no
	// filter; the metric and goal pick one.
	var doc struct {
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				IncludeAll bool   `json:"includeAll"`
				AllValue   string `json:"allValue"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(mustRead(t, dashboards.UIDJobs), &doc); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, v := range doc.Templating.List {
		names = append(names, v.Name)
		all := slices.Contains([]string{"project", "sweep", "state"}, v.Name)
		if all != (v.IncludeAll && v.AllValue == api.AllValue) {
			t.Errorf("variable %s: includeAll %v allValue %q", v.Name, v.IncludeAll, v.AllValue)
		}
	}
	if !slices.Equal(names, []string{"project", "sweep", "state", "metric", "goal"}) {
		t.Errorf("variables %v: each must follow the ones it depends on", names)
	}
}

func mustRead(t *testing.T, uid string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(jsonDir, uid+".json"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}
