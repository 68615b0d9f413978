package plugin

import (
	"slices"
	"strings"

	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/api"
)

// memoryQuery is a run's ZeRO memory bars, from GET /runs/{id}/memory.
var memoryQuery = get[api.MemoryResponse]{
	path:   runPathOf("memory"),
	frames: func(_ request, m api.MemoryResponse) data.Frames { return data.Frames{memoryFrame(m)} },
}

// memoryFrame is the ZeRO bar chart: a part per row, bytes per device in
// separate fields (so the bars stack by where the state lives), then the
// predicted GPU total and each measured peak, named by its source, as
// bars of their own.
func memoryFrame(m api.MemoryResponse) *data.Frame {
	type row struct {
		name  string
		bytes map[string]*float64
	}
	devices := []string{"gpu"}
	var rows []row
	for _, p := range m.Parts {
		dev := p.Device
		if dev == "" {
			dev = "gpu"
		}
		if !slices.Contains(devices, dev) {
			devices = append(devices, dev)
		}
		rows = append(rows, row{p.Name, map[string]*float64{dev: fv(p.Bytes)}})
	}
	rows = append(rows, row{"predicted GPU", map[string]*float64{"gpu": fv(m.PredictedGPUBytes)}})
	if m.PeakGPUBytes != nil {
		rows = append(rows, row{api.PeakNVMLDisplay, map[string]*float64{"gpu": fp(m.PeakGPUBytes)}})
	}
	if m.AllocPeakGPUBytes != nil {
		rows = append(rows, row{api.PeakAllocDisplay, map[string]*float64{"gpu": fp(m.AllocPeakGPUBytes)}})
	}
	fields := []*data.Field{strCol(rows, "part", "Part", func(r row) string { return r.name })}
	for _, dev := range devices {
		fields = append(fields, numCol(rows, dev, "decbytes", strings.ToUpper(dev), func(r row) *float64 { return r.bytes[dev] }))
	}
	f := data.NewFrame("memory", fields...)
	f.Meta = &data.FrameMeta{Custom: map[string]any{"gpu_total_bytes": fp(m.GPUTotalBytes)}}
	return f
}
