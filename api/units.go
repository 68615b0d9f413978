package api

// grafanaUnits maps each unit the query API gives (the GPU metric
// table's, and the step metrics' the query service names) to Grafana's
// unit id, so that panels format values without per-panel overrides.
// Bytes are decimal (GB, not GiB) everywhere, like the run summary's peak
// GPU memory in GB.
var grafanaUnits = map[string]string{
	"":          "none",
	"ms":        "ms",
	"s":         "s",
	"percent":   "percent",
	"ratio":     "percentunit",
	"bytes":     "decbytes",
	"GB":        "decgbytes",
	"W":         "watt",
	"J":         "joule",
	"celsius":   "celsius",
	"MHz":       "suffix: MHz",
	"bytes/s":   "Bps",
	"samples/s": "suffix: samples/s",
	"tokens/s":  "suffix: tokens/s",
}

// GrafanaUnit returns the Grafana unit id a value of unit u is shown in,
// u as the query API names it (a [GPUMetric]'s Unit). A unit not in that
// vocabulary is shown as a suffix rather than dropped. The plugin's
// frames and the provisioned dashboards both take their units from it.
func GrafanaUnit(u string) string {
	if g, ok := grafanaUnits[u]; ok {
		return g
	}
	return "suffix: " + u
}
