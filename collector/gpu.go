package collector

import (
	"slices"
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
	// interval is the sampling interval the device is on, in seconds.
	interval float64
}

type gpuProc struct {
	pid      int64
	memBytes *float64
	who      *announced
}

// gpuSampler turns NVML readings into GPU records, reading each group of
// values at the rate it changes and costs (CPU a call, measured on an
// H100 with collector/gpubench, idle / busy):
//
//   - every sample (the base interval, or the fast one while a training
//     process announced by the hook holds the GPU): utilisation, memory
//     and power — about 0.1 ms together;
//   - every base tick: temperatures, clocks and XID events (40 µs);
//   - every process interval, and at the next sample after an announced
//     training process arrived or left: the compute processes (for
//     attribution, and to tell whether a training process holds the GPU;
//     30 µs / 0.1 ms);
//   - every GPM interval on a GPU a training process holds, else with the
//     counters: GPM (0.4 / 0.6 ms; its metrics are averages between two
//     reads);
//   - every counter interval, staggered over the devices: PCIe, NVLink,
//     ECC, remapped rows and PCIe replays (2 ms, and PCIe throughput waits
//     20 ms per direction);
//   - every energy interval, staggered: the energy counter (3 / 15 ms).
//     Between two reads the energy a record carries is the counter as
//     last read plus the power samples added up since (each sample times
//     the time since the one before: NVML's power is the average over the
//     last second on Hopper and Ampere), never less than the value carried
//     before: a counter read that finds less than was added up holds the
//     value until the counter catches up, so the total never goes down.
//
// Values not read at a sample keep their last reading.
type gpuSampler struct {
	lib  nvml.Iface
	devs []nvml.DeviceInfo
	dev  []gpuDev
	iv   gpuIntervals
}

// gpuIntervals are the sampler's intervals; fast is 0 when adaptive
// sampling is off.
type gpuIntervals struct {
	base, fast, counter, energy, gpm, procs time.Duration
}

// gpuDev is what the sampler keeps of one device between samples.
type gpuDev struct {
	have     bool
	last     nvml.Reading
	state    gpuState
	fast     bool
	nextFast time.Time // next fast sample, while fast
	// When the slower groups are due next.
	nextCounter, nextEnergy, nextGPM, nextProcs time.Time
	// regGen is the registry generation at the last process read.
	regGen     uint64
	nvPrev     nvlinkPrev
	nvTx, nvRx *api.Float // last NVLink rates, kept between counter reads
	energy     energyEst
}

type nvlinkPrev struct {
	tx, rx uint64
	at     time.Time
	ok     bool
}

func newGPUSampler(lib nvml.Iface, iv gpuIntervals) gpuSampler {
	devs := lib.Devices()
	return gpuSampler{lib: lib, devs: devs, dev: make([]gpuDev, len(devs)), iv: iv}
}

// due tells whether the group scheduled at *next is due at now, and if so
// schedules its next read every later; a schedule that fell behind
// restarts from now.
func due(next *time.Time, now time.Time, every time.Duration) bool {
	if now.Before(*next) {
		return false
	}
	*next = next.Add(every)
	if !now.Before(*next) {
		*next = now.Add(every)
	}
	return true
}

// sample reads the devices due at now: every device on a base tick, the
// fast ones between. It returns the latest state of every device read so
// far and the records of the ones read now.
func (g *gpuSampler) sample(now time.Time, baseTick bool, host string, reg *registry) (states []gpuState, fresh []int, firstErr error) {
	gen := reg.generation()
	for i, info := range g.devs {
		d := &g.dev[i]
		if !baseTick && d.have && !(d.fast && !now.Before(d.nextFast)) {
			continue
		}
		want := g.fields(d, i, now, baseTick, gen)
		r, err := g.lib.Read(i, want)
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		d.last = d.last.With(r, want)
		d.last.EnergyMilliJ = d.energy.update(now, r, want)
		d.have = true
		st := gpuState{info: info, r: d.last}
		if want&nvml.FieldsProcs != 0 {
			d.regGen = gen
			st.procs = g.procs(d.last.Processes, reg)
			wasFast := d.fast
			d.fast = g.iv.fast > 0 && holdsAnnounced(st.procs)
			if d.fast && !wasFast && want&nvml.FieldsGPM == 0 {
				// A GPM read at the next sample starts the metrics over
				// the busy time only.
				d.nextGPM = now
			}
		} else {
			// Between process reads the list stands; who a PID is may
			// have changed (announced, or gone).
			st.procs = slices.Clone(d.state.procs)
			for k := range st.procs {
				st.procs[k].who = nil
				if a, ok := reg.lookup(st.procs[k].pid); ok {
					st.procs[k].who = &a
				}
			}
		}
		st.interval = g.iv.base.Seconds()
		if d.fast {
			st.interval = g.iv.fast.Seconds()
			d.nextFast = now.Add(g.iv.fast)
		}
		st.rec = g.record(d, now, host, &g.devs[i], want)
		st.rec.SampleIntervalS = api.F(st.interval)
		for _, p := range st.procs {
			ap := api.GPUProcess{PID: p.pid}
			if p.memBytes != nil {
				ap.MemBytes = api.F(*p.memBytes)
			}
			if p.who != nil {
				ap.RunID, ap.Rank = p.who.RunID, api.Ptr(p.who.Rank)
				// The GPU sample belongs to the lowest rank among its
				// announced processes: one rank per GPU is the usual
				// layout.
				if st.rec.Rank == nil || p.who.Rank < *st.rec.Rank {
					st.rec.RunID, st.rec.Rank = p.who.RunID, api.Ptr(p.who.Rank)
				}
			}
			st.rec.Processes = append(st.rec.Processes, ap)
		}
		d.state = st
		fresh = append(fresh, i)
	}
	for i := range g.dev {
		if g.dev[i].have {
			states = append(states, g.dev[i].state)
		}
	}
	return states, fresh, firstErr
}

// fields chooses what to read of device i at now, and schedules the next
// reads of the slower groups.
func (g *gpuSampler) fields(d *gpuDev, i int, now time.Time, baseTick bool, gen uint64) nvml.Fields {
	if !d.have {
		// Everything once, then the costly groups staggered over the
		// devices so that their cost does not land on one tick.
		stagger := func(every time.Duration) time.Time {
			return now.Add(every + every*time.Duration(i)/time.Duration(len(g.devs)))
		}
		d.nextCounter, d.nextEnergy = stagger(g.iv.counter), stagger(g.iv.energy)
		d.nextGPM, d.nextProcs = now.Add(g.iv.gpm), now.Add(g.iv.procs)
		return nvml.FieldsAll | nvml.FieldsGPM
	}
	want := nvml.FieldsFast
	if baseTick {
		want |= nvml.FieldsTick | nvml.FieldsXID
	}
	if due(&d.nextProcs, now, g.iv.procs) || d.regGen != gen {
		want |= nvml.FieldsProcs
	}
	if due(&d.nextCounter, now, g.iv.counter) {
		want |= nvml.FieldsCounters &^ nvml.FieldsEnergy
		if !d.fast {
			want |= nvml.FieldsGPM
		}
	}
	if due(&d.nextEnergy, now, g.iv.energy) {
		want |= nvml.FieldsEnergy
	}
	if d.fast && due(&d.nextGPM, now, g.iv.gpm) {
		want |= nvml.FieldsGPM
	}
	return want
}

// energyEst is the energy a device's records carry between reads of its
// energy counter: the counter plus the power sampled since, in mJ.
type energyEst struct {
	ok      bool    // the counter has been read
	baseMJ  float64 // the counter at its last read
	sinceMJ float64 // power added up since
	outMJ   float64 // the last value given out
	powerMW float64
	powerAt time.Time
	power   bool // powerMW is a sample taken at powerAt
}

// update takes in what a read at now found and returns the energy to
// carry, nil while the counter has not been read (or is not supported).
func (e *energyEst) update(now time.Time, r nvml.Reading, want nvml.Fields) *uint64 {
	if want&nvml.FieldsPower != 0 {
		if r.PowerMilliW == nil {
			e.power = false
		} else {
			p := float64(*r.PowerMilliW)
			if e.power && now.After(e.powerAt) {
				// NVML's power is the average over the last second, so a
				// sample stands for the time before it (a second apart,
				// exactly; closer, it lags by up to half a second).
				e.sinceMJ += p * now.Sub(e.powerAt).Seconds()
			}
			e.powerMW, e.powerAt, e.power = p, now, true
		}
	}
	if want&nvml.FieldsEnergy != 0 && r.EnergyMilliJ != nil {
		c := float64(*r.EnergyMilliJ)
		if e.ok && c < e.baseMJ {
			// The counter went back: the driver was reloaded. Follow it.
			e.outMJ = c
		}
		e.baseMJ, e.sinceMJ, e.ok = c, 0, true
	}
	if !e.ok {
		return nil
	}
	e.outMJ = max(e.outMJ, e.baseMJ+e.sinceMJ)
	v := uint64(e.outMJ)
	return &v
}

// nextFast is when the next fast sample is due, before the next base tick
// at base; a fast sample that would fall within half a fast interval of
// the base tick is left to it.
func (g *gpuSampler) nextFast(base time.Time) time.Time {
	next := base
	for i := range g.dev {
		d := &g.dev[i]
		if d.fast && d.nextFast.Before(next) && base.Sub(d.nextFast) >= g.iv.fast/2 {
			next = d.nextFast
		}
	}
	return next
}

func (g *gpuSampler) procs(ps []nvml.Process, reg *registry) []gpuProc {
	out := make([]gpuProc, 0, len(ps))
	for _, p := range ps {
		gp := gpuProc{pid: int64(p.PID)}
		if p.UsedMemBytes != nil {
			gp.memBytes = ptrF(float64(*p.UsedMemBytes))
		}
		if a, ok := reg.lookup(int64(p.PID)); ok {
			gp.who = &a
		}
		out = append(out, gp)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].pid < out[b].pid })
	return out
}

func holdsAnnounced(ps []gpuProc) bool {
	for _, p := range ps {
		if p.who != nil {
			return true
		}
	}
	return false
}

func (g *gpuSampler) record(d *gpuDev, now time.Time, host string, info *nvml.DeviceInfo, want nvml.Fields) api.GPU {
	r := d.last
	rec := api.GPU{Kind: api.KindGPU, Time: api.T(now), Host: host, GPU: api.Ptr(info.Index), UUID: info.UUID, Name: info.Name}
	// The values read from NVML as they are, per the metric table; the
	// ones derived from several readings below.
	for _, t := range recordFromNVML {
		if v, ok := t.get(info, &d.last); ok {
			t.m.Set(&rec, v*t.m.NVMLScale)
		}
	}
	if r.RemappedCorr != nil && r.RemappedUncorr != nil {
		rec.RemappedRows = api.F(float64(*r.RemappedCorr + *r.RemappedUncorr))
	}
	if want&nvml.FieldsNVLink != 0 && r.NVLinkTxKiB != nil && r.NVLinkRxKiB != nil {
		p := d.nvPrev
		if p.ok && now.After(p.at) && *r.NVLinkTxKiB >= p.tx && *r.NVLinkRxKiB >= p.rx {
			secs := now.Sub(p.at).Seconds()
			d.nvTx = api.F(float64(*r.NVLinkTxKiB-p.tx) * 1024 / secs)
			d.nvRx = api.F(float64(*r.NVLinkRxKiB-p.rx) * 1024 / secs)
		}
		d.nvPrev = nvlinkPrev{tx: *r.NVLinkTxKiB, rx: *r.NVLinkRxKiB, at: now, ok: true}
	}
	rec.NVLinkTxBps, rec.NVLinkRxBps = d.nvTx, d.nvRx
	return rec
}

// tableRead is a value of the metric table with the getter of the NVML
// value it comes from.
type tableRead struct {
	m   *api.GPUMetric
	get func(*nvml.DeviceInfo, *nvml.Reading) (float64, bool)
}

// recordFromNVML are the record's values read from NVML as they are.
var recordFromNVML = func() []tableRead {
	var out []tableRead
	for i := range api.GPUMetrics {
		m := &api.GPUMetrics[i]
		if m.Field == nil || m.NVML == "" {
			continue
		}
		if get := nvml.Getter(m.NVML); get != nil {
			out = append(out, tableRead{m, get})
		}
	}
	return out
}()
