package dashboards_test

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v4"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/dashboards"
)

// TestCommittedAlertRulesMatchGenerator fails when the provisioned alert
// rules drift from the detectors' table that generates them: someone
// edited the YAML by hand, or changed a detector without regenerating.
func TestCommittedAlertRulesMatchGenerator(t *testing.T) {
	want, err := dashboards.RenderAlerting()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join("..", filepath.FromSlash(dashboards.AlertRulesFile)))
	if err != nil {
		t.Fatalf("%v (run: go run ./dashboards/gen)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the generator; run: go run ./dashboards/gen", dashboards.AlertRulesFile)
	}
}

// TestAlertingProvisioning checks the provisioned Grafana alert rules:
// one per server detector, each asking the DeepSeed data source for that
// kind's open alerts in the numeric format Grafana alerting reads, with a
// threshold over it; the contact point's address comes from the
// environment, and compose mounts the directory.
func TestAlertingProvisioning(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", filepath.FromSlash(dashboards.AlertRulesFile)))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		APIVersion    int `yaml:"apiVersion"`
		ContactPoints []struct {
			Name      string `yaml:"name"`
			Receivers []struct {
				Type     string            `yaml:"type"`
				Settings map[string]string `yaml:"settings"`
			} `yaml:"receivers"`
		} `yaml:"contactPoints"`
		Policies []struct {
			Receiver string `yaml:"receiver"`
		} `yaml:"policies"`
		Groups []struct {
			Rules []struct {
				UID         string `yaml:"uid"`
				Condition   string `yaml:"condition"`
				NoDataState string `yaml:"noDataState"`
				Data        []struct {
					RefID         string         `yaml:"refId"`
					DatasourceUID string         `yaml:"datasourceUid"`
					Model         map[string]any `yaml:"model"`
				} `yaml:"data"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.APIVersion != 1 || len(doc.ContactPoints) != 1 || len(doc.ContactPoints[0].Receivers) != 1 {
		t.Fatalf("want apiVersion 1 and one contact point with one receiver: %+v", doc)
	}
	rc := doc.ContactPoints[0].Receivers[0]
	if rc.Type != "webhook" || rc.Settings["url"] != "${DEEPSEED_ALERT_WEBHOOK_URL}" {
		t.Errorf("receiver %+v; want a webhook to ${DEEPSEED_ALERT_WEBHOOK_URL}", rc)
	}
	if len(doc.Policies) != 1 || doc.Policies[0].Receiver != doc.ContactPoints[0].Name {
		t.Errorf("the notification policy does not route to the contact point: %+v", doc.Policies)
	}
	var kinds []string
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			var query, cond bool
			for _, d := range r.Data {
				switch d.DatasourceUID {
				case dashboards.DatasourceUID:
					k, _ := d.Model["alertKind"].(string)
					query = d.Model["queryType"] == api.QueryAlerts && d.Model["format"] == "numeric" && slices.Contains(api.AlertKinds, k)
					kinds = append(kinds, k)
				case "__expr__":
					cond = d.RefID == r.Condition && d.Model["type"] == "threshold"
				}
			}
			if !query || !cond || r.NoDataState != "OK" {
				t.Errorf("rule %s: want a numeric alerts query of a known kind, a threshold condition and noDataState OK", r.UID)
			}
		}
	}
	slices.Sort(kinds)
	want := slices.Sorted(slices.Values(api.AlertKinds))
	if !slices.Equal(kinds, want) {
		t.Errorf("rules cover kinds %v; want one per detector %v", kinds, want)
	}
	compose, err := os.ReadFile("../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(compose), "./grafana/provisioning/alerting:/etc/grafana/provisioning/alerting") ||
		!strings.Contains(string(compose), "DEEPSEED_ALERT_WEBHOOK_URL:") {
		t.Error("docker-compose.yml does not mount the alerting provisioning or pass DEEPSEED_ALERT_WEBHOOK_URL to Grafana")
	}
}
