package fleettest

import (
	"math"
	"math/rand/v2"
	"time"

	"github.com/deepseed/deepseed/api"
)

// node is a simulated GPU host as its collector sees it.
type node struct {
	host  string
	gpu   string // NVML device name
	uuids []string
	// memTotal is each GPU's memory in bytes; contextBytes what the CUDA
	// context of a process holds beyond its tensors.
	memTotal, contextBytes float64
	// Board power: idle draw, the draw a fully busy board would reach,
	// and the enforced limit it is held to.
	idleW, fullW, capW float64
	// SM clocks: idle, boost, and where a power-capped board settles.
	smIdleMHz, smMaxMHz, smCappedMHz float64
	memMHz                           float64
	idleTempC, loadTempC             float64
	// memTemp: the GPU reports its memory temperature (HBM does, the
	// T4's GDDR6 does not).
	memTemp bool
	// hopper: NVLink and GPM counters (SM active, occupancy, tensor and
	// graphics engine activity), and row remapping.
	hopper  bool
	cpus    int
	hostMem float64
	// hostIdleMem is the host memory in use with no training process.
	hostIdleMem float64
}

// The simulated hosts: the Colab T4 of the BERT run, the two-T4 node of
// the report's pythia runs, and an NVLink H100 node for a short run that
// fills the Hopper-only charts.
var (
	colabT4 = &node{host: "colab-t4", gpu: "Tesla T4", uuids: []string{"GPU-5d1e9c8a-7b1f-4c1e-9a51-2f3c4d5e6f70"},
		memTotal: 15.8e9, contextBytes: 0.35e9, idleW: 9.5, fullW: 78, capW: 70, smIdleMHz: 300, smMaxMHz: 1590, smCappedMHz: 1320,
		memMHz: 5000, idleTempC: 38, loadTempC: 74, cpus: 2, hostMem: 13.6e9, hostIdleMem: 1.4e9}
	t4x2 = &node{host: "t4x2-node", gpu: "Tesla T4",
		uuids:    []string{"GPU-8c2f4a1e-3b6d-4f0a-9e27-5a1c9d3e7b42", "GPU-1e7d9b3c-6a2f-4c8e-b5d1-7f3a2e9c4d18"},
		memTotal: 15.8e9, contextBytes: 0.35e9, idleW: 9.8, fullW: 78, capW: 70, smIdleMHz: 300, smMaxMHz: 1590, smCappedMHz: 1305,
		memMHz: 5000, idleTempC: 36, loadTempC: 76, cpus: 4, hostMem: 31.4e9, hostIdleMem: 2.1e9}
	h100x4 = &node{host: "h100-node", gpu: "NVIDIA H100 80GB HBM3",
		uuids: []string{"GPU-3f9a6c2d-1b4e-4d7a-8c5f-0e2b7a9d6c31", "GPU-a47c1e9b-5d3f-4b2a-9e6c-8d1f3a5b7e20",
			"GPU-6b2e8d4f-9c1a-4e5b-a3d7-2f6c9e1b8a54", "GPU-d9c3a7e1-4f6b-42d8-b1e5-7a3c6f9d2e06"},
		memTotal: 85.5e9, contextBytes: 0.55e9, idleW: 72, fullW: 590, capW: 700, smIdleMHz: 345, smMaxMHz: 1980, smCappedMHz: 1755,
		memMHz: 2619, idleTempC: 31, loadTempC: 62, memTemp: true, hopper: true, cpus: 64, hostMem: 2.0e12, hostIdleMem: 24e9}
)

// NVML clocks-event reasons (nvmlClocksEventReason*).
const (
	reasonIdle     = 0x1
	reasonSWPower  = 0x4
	reasonSWThermo = 0x20
)

// Collector sampling: every 10 s while a run holds the node, every
// minute while it is idle (enough to draw the gaps between runs).
const (
	sampleEvery = 10 * time.Second
	idleEvery   = time.Minute
)

// gpuLoad is what a run asks of each of its GPUs.
type gpuLoad struct {
	// util and memBytes are the steady utilisation and memory in use
	// (NVML's view: the allocator's pool plus the CUDA context).
	util, memBytes float64
	// busyFrom..busyTo is the training loop; before it the process loads
	// the model, after it the process saves and exits at end.
	busyFrom, busyTo, end time.Time
	// warmup is how long utilisation and memory take to settle.
	warmup time.Duration
	// pcieBps and nvlinkBps are the steady traffic each way per GPU.
	pcieBps, nvlinkBps float64
	// hostCPU is the node's CPU use in percent while training; rss each
	// training process's resident memory.
	hostCPU, rss float64
	pid0         int64
	// eccAt, when not zero, is when GPU 0 corrects one ECC error.
	eccAt time.Time
}

// gpuState carries what a collector's counters and a board's thermal
// mass keep from one sample to the next.
type gpuState struct {
	temp, energy float64
	at           time.Time
}

// telemetry returns the node's GPU and host samples over the run: idle
// from idleFrom until the run starts, attributed to the run's ranks while
// it holds the GPUs, idle again until idleTo (zero: no tail).
func (r *DemoRun) telemetry(l gpuLoad, idleFrom, idleTo time.Time) []any {
	n := r.node
	rng := rand.New(rand.NewPCG(r.Seed, 0x7e1e))
	states := make([]gpuState, len(n.uuids))
	for g := range states {
		// A board's energy counter runs since the driver loaded; start it
		// somewhere plausible and distinct per GPU.
		states[g] = gpuState{temp: n.idleTempC, energy: 3.6e6 * float64(40+7*g+int(r.Seed%50)), at: r.Start}
	}
	var out []any
	start := r.Start.Truncate(sampleEvery)
	if !idleFrom.IsZero() {
		for ts := idleFrom.Truncate(idleEvery).Add(idleEvery); ts.Before(start); ts = ts.Add(idleEvery) {
			out = append(out, r.samples(l, ts, false, states, rng)...)
		}
	}
	for ts := start; !ts.After(l.end); ts = ts.Add(sampleEvery) {
		out = append(out, r.samples(l, ts, true, states, rng)...)
	}
	if !idleTo.IsZero() {
		for ts := l.end.Truncate(idleEvery).Add(idleEvery); !ts.After(idleTo); ts = ts.Add(idleEvery) {
			out = append(out, r.samples(l, ts, false, states, rng)...)
		}
	}
	return out
}

// samples returns one GPU sample per GPU of the node and one host sample
// at ts; attached says the run's processes hold the first Ranks GPUs.
func (r *DemoRun) samples(l gpuLoad, ts time.Time, attached bool, states []gpuState, rng *rand.Rand) []any {
	n := r.node
	out := make([]any, 0, len(n.uuids)+1)
	busy := attached && !ts.Before(l.busyFrom) && !ts.After(l.busyTo)
	// settle rises from 0 to 1 over the warm-up.
	settle := 1.0
	if busy && l.warmup > 0 {
		settle = math.Min(1, float64(ts.Sub(l.busyFrom))/float64(l.warmup))
	}
	var procs []api.HostProcess
	for g := range n.uuids {
		st := &states[g]
		mine := attached && g < r.Ranks
		// With no process NVML still counts the driver's reservation.
		util, mem := 0.0, 0.26e9
		switch {
		case busy && mine:
			util = math.Min(100, l.util*(0.5+0.5*settle)+2.5*rng.NormFloat64())
			mem = l.memBytes * (0.6 + 0.4*settle) * (1 - 0.004*rng.Float64())
		case mine && ts.Before(l.busyFrom):
			// Loading the model: the context and the weights, little compute.
			util, mem = 3*rng.Float64(), n.contextBytes+0.3*l.memBytes*float64(ts.Sub(r.Start))/float64(l.busyFrom.Sub(r.Start)+1)
		case mine:
			// Saving the last checkpoint before exiting.
			util, mem = 5*rng.Float64(), l.memBytes
		}
		util = math.Max(0, util)
		load := util / 100
		// The board settles towards its load temperature within a few
		// minutes; power follows utilisation up to the enforced limit.
		target := n.idleTempC + (n.loadTempC-n.idleTempC)*load
		dt := ts.Sub(st.at).Seconds()
		st.temp = target + (st.temp-target)*math.Exp(-dt/90)
		power := n.idleW + (n.fullW-n.idleW)*load + 0.02*n.fullW*rng.NormFloat64()
		if mine && util < 10 {
			power += 0.08 * (n.fullW - n.idleW) // a process keeps the board out of its deepest idle state
		}
		capped := power >= n.capW
		power = math.Max(n.idleW*0.95, math.Min(power, n.capW-0.6*rng.Float64()))
		st.energy += power * dt
		st.at = ts
		var reasons int64
		clock := n.smMaxMHz
		switch {
		case util < 5:
			reasons, clock = reasonIdle, n.smIdleMHz
			if mine {
				clock = n.smMaxMHz
			}
		case capped:
			// At the limit the driver lowers the clocks to stay under it.
			reasons, clock = reasonSWPower, n.smCappedMHz+30*rng.NormFloat64()
		}
		if st.temp > 83 {
			reasons |= reasonSWThermo
		}
		memUtil := 0.0
		if busy && mine {
			memUtil = util * 0.45
		}
		s := &api.GPU{Kind: api.KindGPU, Time: api.T(ts), Host: n.host, GPU: api.Ptr(g), UUID: n.uuids[g], Name: n.gpu,
			UtilPct: api.F(round(util, 1)), MemUtilPct: api.F(round(memUtil, 1)), MemUsedBytes: api.F(math.Round(mem)),
			MemTotalBytes: api.F(n.memTotal), PowerW: api.F(round(power, 2)), EnergyJ: api.F(math.Round(st.energy)),
			TempC: api.F(math.Round(st.temp)), SMClockMHz: api.F(math.Round(clock)), MemClockMHz: api.F(n.memMHz),
			PCIeReplays: api.F(0), XIDLast: api.F(0), XIDTotal: api.F(0), ECCCorrected: api.F(0), ECCUncorrected: api.F(0),
			ThrottleReasons: api.Ptr(reasons)}
		if n.memTemp {
			s.MemTempC = api.F(math.Round(st.temp + 4 + 6*load))
		}
		// Traffic: the PCIe link carries input batches and, with
		// offload, gradients and parameters; NVLink the collectives.
		pcie, nvl := 0.3e6*rng.Float64(), 0.0
		if busy && mine {
			pcie = l.pcieBps * (0.9 + 0.2*rng.Float64()) * settle
			nvl = l.nvlinkBps * (0.9 + 0.2*rng.Float64()) * settle
		}
		s.PCIeTxBps, s.PCIeRxBps = api.F(math.Round(pcie)), api.F(math.Round(pcie*1.04))
		if n.hopper {
			s.NVLinkTxBps, s.NVLinkRxBps = api.F(math.Round(nvl)), api.F(math.Round(nvl))
			s.RemappedRows = api.F(0)
			if g == 0 && !l.eccAt.IsZero() && !ts.Before(l.eccAt) {
				s.ECCCorrected = api.F(1)
			}
			// GPM: of the time a kernel ran (util), how much of the SMs
			// worked, how full they were and how much the tensor cores did.
			gr := util * 0.98
			s.GrEngineActivePct, s.SMActivePct = api.F(round(gr, 1)), api.F(round(gr*0.86, 1))
			s.SMOccupancyPct, s.TensorActivePct = api.F(round(gr*0.41, 1)), api.F(round(gr*0.52, 1))
		}
		if mine {
			s.RunID, s.Rank = r.ID, api.Ptr(g)
			pid := l.pid0 + int64(g)
			s.Processes = []api.GPUProcess{{PID: pid, MemBytes: api.F(math.Round(mem)), RunID: r.ID, Rank: api.Ptr(g)}}
			cpu := 100 * float64(n.cpus) * l.hostCPU / 100 * 0.9 / float64(r.Ranks)
			if !busy {
				cpu = 100 * (0.6 + 0.4*rng.Float64())
			}
			procs = append(procs, api.HostProcess{PID: pid, RunID: r.ID, Rank: api.Ptr(g),
				CPUPct: api.F(round(cpu*(0.95+0.1*rng.Float64()), 1)), RSSBytes: api.F(math.Round(l.rss * (0.98 + 0.02*rng.Float64())))})
		}
		out = append(out, s)
	}
	h := &api.Host{Kind: api.KindHost, Time: api.T(ts), Host: n.host, MemTotalBytes: api.F(n.hostMem)}
	cpu, mem := 1+2*rng.Float64(), n.hostIdleMem
	if attached {
		mem += float64(r.Ranks) * l.rss
		cpu = 100 / float64(n.cpus) * float64(r.Ranks) * (0.7 + 0.3*rng.Float64())
		if busy {
			// The compare view's CPU column is the mean of these samples
			// over a steady state of a dozen or so: the table's figure
			// to its one decimal, within the sampling jitter.
			cpu = l.hostCPU + 0.04*rng.NormFloat64()
		}
		h.Processes = procs
	}
	h.CPUUtilPct, h.MemUsedBytes = api.F(round(math.Max(0, cpu), 1)), api.F(math.Round(mem))
	h.Load1 = api.F(round(float64(n.cpus)*cpu/100, 2))
	return append(out, h)
}
