package nvml

import (
	"testing"

	"github.com/deepseed/deepseed/api"
)

// collectorCalls are the calls of the call table that no value of the
// metric table names: the older memory call Read falls back to, the GPM
// sample the metrics are computed from, and the process list.
var collectorCalls = map[string]bool{"memory_info": true, "gpm_sample": true, "compute_processes": true}

// TestCallTableFollowsTheMetricTable holds the collector's NVML call
// table to the metric table: every reading a metric names comes from a
// call the table has a row (and so an id) for, every row serves a metric
// or the collector itself, and a device fact needs no call.
func TestCallTableFollowsTheMetricTable(t *testing.T) {
	named := map[string]bool{}
	for _, m := range api.GPUMetrics {
		_, fact := infoFields[m.NVML]
		switch {
		case m.NVML == "" && m.NVMLCall != "":
			t.Errorf("metric %q: NVMLCall %q without an NVML reading", m.Name, m.NVMLCall)
		case m.NVML == "":
		case fact && m.NVMLCall != "":
			t.Errorf("metric %q: %q is a device fact, read at Init: no NVMLCall", m.Name, m.NVML)
		case !fact && m.NVMLCall == "":
			t.Errorf("metric %q reads NVML's %q but names no NVMLCall", m.Name, m.NVML)
		case !fact:
			if _, ok := callID[m.NVMLCall]; !ok {
				t.Errorf("metric %q: NVMLCall %q has no row in nvmlCalls", m.Name, m.NVMLCall)
			}
			named[m.NVMLCall] = true
		}
	}
	for c := range nvmlCalls {
		name := nvmlCalls[c].name
		if named[name] == collectorCalls[name] {
			t.Errorf("call %q: named by the metric table %v, the collector's own %v: want exactly one", name, named[name], collectorCalls[name])
		}
		if callID[name] != call(c) || callNames[c] != name {
			t.Errorf("call %q: id %d, name of id %d %q", name, callID[name], c, callNames[c])
		}
	}
}
