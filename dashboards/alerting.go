package dashboards

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"text/template"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/detect"
)

// AlertRulesFile is where Grafana's alerting provisioning lives in the
// repository; docker-compose.yml mounts its directory.
const AlertRulesFile = "grafana/provisioning/alerting/deepseed.yaml"

// AlertRule is the Grafana alert rule of one server detector: it asks the
// data source for the open alerts of the detector's kind in the numeric
// format (one number per open alert, labelled run_id, project, kind,
// subject and rank) and fires while there is one.
type AlertRule struct {
	UID, Title, Kind, Severity, Summary, Description string
}

// AlertRules returns one rule per detector of detect.Table, in its order.
func AlertRules() []AlertRule {
	out := make([]AlertRule, 0, len(detect.Table))
	for _, d := range detect.Table {
		r := AlertRule{UID: "deepseed-" + strings.ReplaceAll(d.Kind, "_", "-"), Title: "DeepSeed: " + d.Title,
			Kind: d.Kind, Severity: string(d.Severity), Summary: d.Summary, Description: d.Description}
		if r.Summary == "" {
			r.Summary = d.Title + " on run {{ $labels.run_id }} {{ $labels.subject }}"
		}
		if r.Description == "" {
			r.Description = fmt.Sprintf("The DeepSeed server opened a %s alert; GET /api/v1/alerts?run_id={{ $labels.run_id }}&kind=%s gives its text, value and threshold.", d.Kind, d.Kind)
		}
		out = append(out, r)
	}
	return out
}

// RenderAlerting returns Grafana's alerting provisioning file: the contact
// point, the notification policy and AlertRules.
func RenderAlerting() ([]byte, error) {
	var b bytes.Buffer
	err := alertingTemplate.Execute(&b, map[string]any{
		"Rules": AlertRules(), "Datasource": DatasourceUID, "Query": api.QueryAlerts, "Format": api.FormatNumeric,
	})
	if err != nil {
		return nil, fmt.Errorf("render alert rules: %w", err)
	}
	return b.Bytes(), nil
}

// The template writes Grafana's YAML by hand, flow style where a list or
// map is short, as a person would; [[ ]] delimit it, since the rules'
// own texts are Grafana templates in {{ }}. quote writes a YAML
// double-quoted string (Go's escapes are YAML's).
var alertingTemplate = template.Must(template.New("alerting").Delims("[[", "]]").
	Funcs(template.FuncMap{"quote": strconv.Quote}).Parse(`# Grafana alerting provisioning for DeepSeed, read at start from
# provisioning/alerting (docker-compose.yml mounts this directory). One
# rule per server detector: each asks the DeepSeed data source for the
# open alerts of that kind in the numeric format (one number per open
# alert, labelled run_id, project, kind, subject and rank), so a rule
# fires once per open alert and resolves when the server resolves it. No
# open alert is no data, which is OK.
#
# Notifications go to a webhook whose address is the environment variable
# DEEPSEED_ALERT_WEBHOOK_URL of the Grafana process; the README shows how
# to route them to Slack or e-mail instead.
#
# Generated from the detectors' table (detect) by
# go run ./dashboards/gen; do not edit.
apiVersion: 1

contactPoints:
  - orgId: 1
    name: DeepSeed webhook
    receivers:
      - uid: deepseed-webhook
        type: webhook
        settings:
          url: ${DEEPSEED_ALERT_WEBHOOK_URL}
          httpMethod: POST
        disableResolveMessage: false

policies:
  - orgId: 1
    receiver: DeepSeed webhook
    group_by: ["alertname", "run_id"]
    group_wait: 30s
    group_interval: 5m
    repeat_interval: 4h

groups:
  - orgId: 1
    name: DeepSeed detectors
    folder: DeepSeed
    interval: 1m
    rules:
[[- range .Rules ]]
      - uid: [[ .UID ]]
        title: [[ quote .Title ]]
        condition: C
        data:
          - refId: A
            relativeTimeRange: {from: 600, to: 0}
            datasourceUid: [[ $.Datasource ]]
            model:
              refId: A
              queryType: [[ $.Query ]]
              alertKind: [[ .Kind ]]
              format: [[ $.Format ]]
          - refId: C
            datasourceUid: __expr__
            model:
              refId: C
              type: threshold
              expression: A
              conditions:
                - evaluator: {type: gt, params: [0]}
        noDataState: OK
        execErrState: Error
        for: 0s
        labels:
          severity: [[ .Severity ]]
        annotations:
          summary: [[ quote .Summary ]]
          description: [[ quote .Description ]]
[[- end ]]
`))
