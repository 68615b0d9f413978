package nvml

import (
	"reflect"
	"strings"
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

// TestWithTakesEveryMetricFromItsCallsGroup holds Reading.With to the
// call table: a value a metric reads is taken from a fresh reading when
// the group of the call that gives it was read. A field left out of With
// is never sampled: the collector keeps its first, empty, reading of it.
func TestWithTakesEveryMetricFromItsCallsGroup(t *testing.T) {
	for _, m := range api.GPUMetrics {
		if m.NVMLCall == "" {
			continue
		}
		c, ok := callID[m.NVMLCall]
		if !ok {
			continue // TestCallTableFollowsTheMetricTable reports it
		}
		var fresh Reading
		if !setReading(&fresh, m.NVML) {
			t.Errorf("NVML's %q: nvml.Reading has no such pointer field", m.NVML)
			continue
		}
		got := Reading{}.With(fresh, nvmlCalls[c].group)
		if _, ok := Getter(m.NVML)(&DeviceInfo{}, &got); !ok {
			t.Errorf("NVML's %q: Reading.With does not take it when the group of its call %q is read; add it to that group's line", m.NVML, m.NVMLCall)
		}
	}
}

// setReading sets the field of r whose JSON name is name to a value.
func setReading(r *Reading, name string) bool {
	v := reflect.ValueOf(r).Elem()
	for i := 0; i < v.NumField(); i++ {
		f := v.Type().Field(i)
		if strings.Split(f.Tag.Get("json"), ",")[0] != name || f.Type.Kind() != reflect.Pointer {
			continue
		}
		p := reflect.New(f.Type.Elem())
		switch p.Elem().Kind() {
		case reflect.Bool:
			p.Elem().SetBool(true)
		case reflect.Uint32, reflect.Uint64:
			p.Elem().SetUint(1)
		case reflect.Float64:
			p.Elem().SetFloat(1)
		default:
			return false
		}
		v.Field(i).Set(p)
		return true
	}
	return false
}
