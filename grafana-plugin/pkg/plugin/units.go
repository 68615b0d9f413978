package plugin

import "strings"

// grafanaUnit maps a unit as the query service names it to Grafana's
// unit id, so panels format values without per-panel overrides. An
// unknown unit is shown as a suffix rather than dropped.
func grafanaUnit(u string) string {
	switch strings.ToLower(strings.TrimSpace(u)) {
	case "", "none", "count", "1":
		return "none"
	case "ms", "millisecond", "milliseconds":
		return "ms"
	case "s", "sec", "second", "seconds":
		return "s"
	case "percent", "%", "pct":
		return "percent"
	case "ratio", "fraction", "percentunit":
		return "percentunit"
	// Bytes are decimal (GB, not GiB) everywhere, like the run summary's
	// peak GPU memory in GB.
	case "bytes", "byte", "b":
		return "decbytes"
	case "kb", "kib":
		return "kbytes"
	case "mb", "mib":
		return "decmbytes"
	case "gb", "gib":
		return "decgbytes"
	case "w", "watt", "watts":
		return "watt"
	case "j", "joule", "joules":
		return "joule"
	case "c", "°c", "celsius":
		return "celsius"
	case "mhz":
		return "suffix: MHz"
	case "bytes/s", "b/s", "bps":
		return "Bps"
	case "samples/s", "sps":
		return "suffix: samples/s"
	case "tokens/s":
		return "suffix: tokens/s"
	case "steps/s":
		return "suffix: steps/s"
	}
	return "suffix: " + u
}

// metricUnit returns the Grafana unit of a metric, from the unit the
// server gives or, when it gives none, from the metric's name.
func metricUnit(metric, serverUnit string) string {
	if serverUnit != "" {
		return grafanaUnit(serverUnit)
	}
	switch {
	case strings.HasSuffix(metric, "_ms"):
		return "ms"
	case strings.HasSuffix(metric, "_pct"):
		return "percent"
	case strings.HasSuffix(metric, "_gb"):
		return "decgbytes"
	case strings.HasSuffix(metric, "_mb"):
		return "decmbytes"
	case strings.HasSuffix(metric, "_bytes"):
		return "decbytes"
	case strings.HasSuffix(metric, "_w"):
		return "watt"
	case strings.HasSuffix(metric, "_c"):
		return "celsius"
	case strings.HasSuffix(metric, "_mhz"):
		return "suffix: MHz"
	case strings.HasSuffix(metric, "_sps"):
		return "suffix: samples/s"
	}
	return "none"
}
