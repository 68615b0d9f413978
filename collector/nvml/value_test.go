package nvml_test

import (
	"testing"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/collector/nvml"
)

// Every NVML value the metric table names is a field of the reading or
// of the device's facts, and its getter reads it in NVML's unit.
func TestMetricTableNamesNVMLFields(t *testing.T) {
	for _, m := range api.GPUMetrics {
		if m.NVML != "" && nvml.Getter(m.NVML) == nil {
			t.Errorf("metric %q reads NVML's %q, which neither nvml.Reading nor nvml.DeviceInfo has", m.Name, m.NVML)
		}
	}
	power, pending, energy, sm := uint32(612345), true, uint64(1)<<40, 62.5
	info := nvml.DeviceInfo{GPM: true, Index: 3}
	r := nvml.Reading{PowerMilliW: &power, RemapPending: &pending, EnergyMilliJ: &energy, GPMSMActivePct: &sm}
	for name, want := range map[string]float64{"power_mw": 612345, "remap_pending": 1, "gpm": 1, "index": 3,
		"energy_mj": 1 << 40, "gpm_sm_active_pct": 62.5} {
		if v, ok := nvml.Getter(name)(&info, &r); !ok || v != want {
			t.Errorf("Value(%s) = %v, %v; want %v", name, v, ok, want)
		}
	}
	if nvml.Getter("no_such_value") != nil {
		t.Error("a getter for a name no field has")
	}
	if v, ok := nvml.Getter("temp_c")(&info, &r); ok {
		t.Errorf("Value(temp_c) of a reading without it = %v, true", v)
	}
}
