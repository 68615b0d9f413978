package dashboards_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/grafana/grafana-plugin-sdk-go/backend"
	"go.yaml.in/yaml/v4"

	"github.com/deepseed/deepseed/dashboards"
	"github.com/deepseed/deepseed/demo"
	"github.com/deepseed/deepseed/grafana-plugin/pkg/plugin"
	"github.com/deepseed/deepseed/store/storetest"
)

// BenchmarkAlertRules sends each provisioned alert rule's query, as
// Grafana's alerting sends it (the rule's model over its relative range,
// through the plugin), to a real server holding the demo: one
// sub-benchmark a rule, so a slow rule stands out. Beside the demo the
// alerts table holds a long history: resolvedHistory resolved alerts of
// every kind over 2,000 runs, as a server that has watched runs for
// months keeps them (the rules ask for open ones only).
//
//	go test ./dashboards/ -run '^$' -bench AlertRules -benchtime 200x
func BenchmarkAlertRules(b *testing.B) {
	st := storetest.NewStore(b)
	base, readToken, ingestToken := startServerOn(b, st)
	ctx := context.Background()
	if _, err := storetest.Pool(b, st).Exec(ctx, `INSERT INTO alerts (run_id, kind, subject, text, at, opened_at, resolved_at)
		SELECT 'old-' || (i % 2000), (ARRAY['non_finite','overflow_storm','loss_spike','idle_gpu','stalled','rank_stopped','data_stall','straggler','hang'])[1 + i % 9],
			'rank ' || (i % 8), 'resolved', now() - make_interval(mins => i), now() - make_interval(mins => i), now() - make_interval(mins => i - 1)
		FROM generate_series(1, $1) AS i`, resolvedHistory); err != nil {
		b.Fatal(err)
	}
	var n int64
	if err := storetest.Pool(b, st).QueryRow(ctx, `SELECT count(*) FROM alerts`).Scan(&n); err != nil || n < resolvedHistory {
		b.Fatalf("%d alerts (%v), want the history of %d", n, err, resolvedHistory)
	}
	if _, err := demo.Load(ctx, demo.Options{Server: base, Token: ingestToken, Anchor: time.Now()}); err != nil {
		b.Fatalf("load demo: %v", err)
	}
	inst, err := plugin.NewDatasource(ctx, backend.DataSourceInstanceSettings{
		UID: dashboards.DatasourceUID, Name: "DeepSeed",
		JSONData:                []byte(fmt.Sprintf(`{"url":%q}`, base)),
		DecryptedSecureJSONData: map[string]string{"token": readToken},
	})
	if err != nil {
		b.Fatal(err)
	}
	ds := inst.(*plugin.Datasource)
	raw, err := os.ReadFile("../grafana/provisioning/alerting/deepseed.yaml")
	if err != nil {
		b.Fatal(err)
	}
	var doc struct {
		Groups []struct {
			Rules []struct {
				UID  string `yaml:"uid"`
				Data []struct {
					RefID             string               `yaml:"refId"`
					DatasourceUID     string               `yaml:"datasourceUid"`
					RelativeTimeRange struct{ From int64 } `yaml:"relativeTimeRange"`
					Model             map[string]any       `yaml:"model"`
				} `yaml:"data"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		b.Fatal(err)
	}
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			for _, d := range r.Data {
				if d.DatasourceUID != dashboards.DatasourceUID {
					continue
				}
				model, err := json.Marshal(d.Model)
				if err != nil {
					b.Fatal(err)
				}
				b.Run(r.UID, func(b *testing.B) {
					for range b.N {
						now := time.Now()
						resp, err := ds.QueryData(ctx, &backend.QueryDataRequest{Queries: []backend.DataQuery{{
							RefID: d.RefID, JSON: model, MaxDataPoints: 43200, Interval: time.Second,
							TimeRange: backend.TimeRange{From: now.Add(-time.Duration(d.RelativeTimeRange.From) * time.Second), To: now},
						}}})
						if err != nil || resp.Responses[d.RefID].Error != nil {
							b.Fatalf("rule %s: %v %v", r.UID, err, resp.Responses[d.RefID].Error)
						}
					}
				})
			}
		}
	}
}

// resolvedHistory is how many resolved alerts BenchmarkAlertRules puts
// beside the demo.
const resolvedHistory = 200_000
