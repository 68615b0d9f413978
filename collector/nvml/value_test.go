package nvml_test

import (
	"testing"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/collector/nvml"
)

// Every NVML value the metric table names is a field of the reading or
// of the device's facts, and Value reads it in NVML's unit.
func TestMetricTableNamesNVMLFields(t *testing.T) {
	for _, m := range api.GPUMetrics {
		if m.NVML != "" && !nvml.HasValue(m.NVML) {
			t.Errorf("metric %q reads NVML's %q, which neither nvml.Reading nor nvml.DeviceInfo has", m.Name, m.NVML)
		}
	}
	power, pending := uint32(612345), true
	info := nvml.DeviceInfo{GPM: true}
	r := nvml.Reading{PowerMilliW: &power, RemapPending: &pending}
	for name, want := range map[string]float64{"power_mw": 612345, "remap_pending": 1, "gpm": 1} {
		if v, ok := nvml.Value(&info, &r, name); !ok || v != want {
			t.Errorf("Value(%s) = %v, %v; want %v", name, v, ok, want)
		}
	}
	if v, ok := nvml.Value(&info, &r, "temp_c"); ok {
		t.Errorf("Value(temp_c) of a reading without it = %v, true", v)
	}
}
