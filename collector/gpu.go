package collector

import (
	"sort"
	"time"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/collector/nvml"
)

// gpuState is the latest reading of one device with what the collector
// derived from it, kept for /metrics.
type gpuState struct {
	info  nvml.DeviceInfo
	r     nvml.Reading
	rec   api.GPU
	procs []gpuProc
}

type gpuProc struct {
	pid      int64
	memBytes *float64
	who      *announced
}

// gpuSampler turns NVML readings into GPU records. It remembers the last
// NVLink counters to turn them into rates.
type gpuSampler struct {
	lib  nvml.Iface
	devs []nvml.DeviceInfo
	prev map[int]nvlinkPrev
}

type nvlinkPrev struct {
	tx, rx uint64
	at     time.Time
}

func (g *gpuSampler) sample(now time.Time, host string, reg *registry) ([]gpuState, error) {
	out := make([]gpuState, 0, len(g.devs))
	var firstErr error
	for i, info := range g.devs {
		r, err := g.lib.Read(i)
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		st := gpuState{info: info, r: r}
		st.rec = g.record(i, now, host, info, r)
		for _, p := range r.Processes {
			gp := gpuProc{pid: int64(p.PID)}
			ap := api.GPUProcess{PID: int64(p.PID)}
			if p.UsedMemBytes != nil {
				gp.memBytes = ptrF(float64(*p.UsedMemBytes))
				ap.MemBytes = api.F(float64(*p.UsedMemBytes))
			}
			if a, ok := reg.lookup(int64(p.PID)); ok {
				gp.who = &a
				ap.RunID, ap.Rank = a.RunID, api.Ptr(a.Rank)
			}
			st.procs = append(st.procs, gp)
			st.rec.Processes = append(st.rec.Processes, ap)
		}
		sort.Slice(st.procs, func(a, b int) bool { return st.procs[a].pid < st.procs[b].pid })
		// The GPU sample belongs to the lowest rank among its announced
		// processes: one rank per GPU is the usual layout.
		for _, p := range st.procs {
			if p.who != nil && (st.rec.Rank == nil || p.who.Rank < *st.rec.Rank) {
				st.rec.RunID, st.rec.Rank = p.who.RunID, api.Ptr(p.who.Rank)
			}
		}
		out = append(out, st)
	}
	return out, firstErr
}

func (g *gpuSampler) record(i int, now time.Time, host string, info nvml.DeviceInfo, r nvml.Reading) api.GPU {
	rec := api.GPU{Kind: api.KindGPU, Time: api.T(now), Host: host, GPU: api.Ptr(info.Index), UUID: info.UUID, Name: info.Name}
	u32 := func(p *uint32, scale float64) *api.Float {
		if p == nil {
			return nil
		}
		return api.F(float64(*p) * scale)
	}
	u64 := func(p *uint64, scale float64) *api.Float {
		if p == nil {
			return nil
		}
		return api.F(float64(*p) * scale)
	}
	f64 := func(p *float64) *api.Float {
		if p == nil {
			return nil
		}
		return api.F(*p)
	}
	rec.UtilPct = u32(r.UtilGPUPct, 1)
	rec.MemUtilPct = u32(r.UtilMemPct, 1)
	rec.MemUsedBytes = u64(r.MemUsedBytes, 1)
	rec.MemTotalBytes = u64(r.MemTotalBytes, 1)
	rec.MemReservedBytes = u64(r.MemReservedBytes, 1)
	rec.PowerW = u32(r.PowerMilliW, 1e-3)
	rec.EnergyJ = u64(r.EnergyMilliJ, 1e-3)
	rec.TempC = u32(r.TempC, 1)
	rec.MemTempC = u32(r.MemTempC, 1)
	rec.SMClockMHz = u32(r.SMClockMHz, 1)
	rec.MemClockMHz = u32(r.MemClockMHz, 1)
	// NVML's PCIe throughput is in KB/s of 1024 bytes.
	rec.PCIeTxBps = u32(r.PCIeTxKBps, 1024)
	rec.PCIeRxBps = u32(r.PCIeRxKBps, 1024)
	rec.PCIeReplays = u64(r.PCIeReplays, 1)
	rec.XIDLast = u64(r.XIDLast, 1)
	rec.XIDTotal = u64(r.XIDCount, 1)
	rec.ECCCorrected = u64(r.ECCCorrected, 1)
	rec.ECCUncorrected = u64(r.ECCUncorrected, 1)
	if r.RemappedCorr != nil && r.RemappedUncorr != nil {
		rec.RemappedRows = api.F(float64(*r.RemappedCorr + *r.RemappedUncorr))
	}
	if r.ClocksEventMask != nil {
		rec.ThrottleReasons = api.Ptr(int64(*r.ClocksEventMask))
	}
	rec.SMActivePct = f64(r.GPMSMActivePct)
	rec.SMOccupancyPct = f64(r.GPMSMOccupancy)
	rec.TensorActivePct = f64(r.GPMTensorPct)
	rec.GrEngineActivePct = f64(r.GPMGraphicsPct)
	if r.NVLinkTxKiB != nil && r.NVLinkRxKiB != nil {
		if p, ok := g.prev[i]; ok && now.After(p.at) && *r.NVLinkTxKiB >= p.tx && *r.NVLinkRxKiB >= p.rx {
			secs := now.Sub(p.at).Seconds()
			rec.NVLinkTxBps = api.F(float64(*r.NVLinkTxKiB-p.tx) * 1024 / secs)
			rec.NVLinkRxBps = api.F(float64(*r.NVLinkRxKiB-p.rx) * 1024 / secs)
		}
		if g.prev == nil {
			g.prev = map[int]nvlinkPrev{}
		}
		g.prev[i] = nvlinkPrev{tx: *r.NVLinkTxKiB, rx: *r.NVLinkRxKiB, at: now}
	}
	return rec
}
