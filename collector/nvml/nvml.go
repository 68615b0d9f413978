// Package nvml puts the NVIDIA Management Library behind one small
// interface, [Iface], so that the collector can be tested without a GPU.
//
// Usage:
//  1. Real hardware: r := &nvml.Real{}; r.Init() — the library is opened at
//     run time; without libnvidia-ml Init returns an error and nothing else
//     needs it.
//  2. Tests: c, _ := nvml.LoadCapture("testdata/capture.json");
//     f := nvml.NewFake(c, 0) replays readings captured on a real GPU.
//  3. Capturing: wrap any Iface in a [Recorder]; it writes every reading to
//     a file in the capture format that [LoadCapture] reads.
//
// Readings are kept in NVML's own units (milliwatts, millijoules, KB/s, …);
// the collector converts them where it exports them.
package nvml

import (
	"encoding/json"
	"fmt"
	"os"
)

// Iface is what the collector needs from NVML.
type Iface interface {
	// Init loads the library and enumerates the devices. It must be called
	// once before the other methods.
	Init() error
	// Shutdown releases the library.
	Shutdown() error
	// Devices lists the devices found by Init, in sampling order. MIG
	// instances of a GPU in MIG mode are listed after their parent.
	Devices() []DeviceInfo
	// Read takes one reading of the device at position i of Devices,
	// of the fields in want. Values not asked for, and values the device
	// does not support, are nil.
	Read(i int, want Fields) (Reading, error)
}

// Fields selects the groups of values a Read reads. The collector reads
// each group at the rate its values change: the cheap, quickly changing
// ones every tick, counters and health fields every few seconds.
type Fields uint32

const (
	// FieldsUtil: GPU and memory utilisation.
	FieldsUtil Fields = 1 << iota
	// FieldsMemory: device memory total, used, free, reserved.
	FieldsMemory
	// FieldsPower: power draw.
	FieldsPower
	// FieldsClocks: SM and memory clocks and the clocks-event reasons.
	FieldsClocks
	// FieldsGPM: GPM metrics over the interval since the last GPM read.
	FieldsGPM
	// FieldsEnergy: the energy counter. On Hopper it costs milliseconds
	// of CPU a read, a thousand times what the power draw costs.
	FieldsEnergy
	// FieldsPCIe: PCIe throughput; NVML measures it over 20 ms, and the
	// call waits that long.
	FieldsPCIe
	// FieldsNVLink: NVLink data counters.
	FieldsNVLink
	// FieldsHealth: ECC errors, remapped rows, PCIe replays.
	FieldsHealth
	// FieldsXID: XID error events that arrived since the last read.
	FieldsXID
	// FieldsProcs: the compute processes and their device memory.
	FieldsProcs
	// FieldsTemp: GPU and memory temperature.
	FieldsTemp

	// FieldsTick are the cheap, quickly changing values read every base
	// tick. GPM is not among them: a GPM sample and its metrics cost about
	// 0.5 ms of CPU on an H100, and the metrics are averages over the time
	// between two samples anyway.
	FieldsTick = FieldsFast | FieldsTemp | FieldsClocks
	// FieldsFast are what a run's GPU figures need, read at every sample,
	// the fast ones between base ticks too: utilisation, memory and power
	// (0.1 ms together on a busy H100, three quarters of FieldsTick).
	FieldsFast = FieldsUtil | FieldsMemory | FieldsPower
	// FieldsCounters are the costly or slowly changing ones.
	FieldsCounters = FieldsEnergy | FieldsPCIe | FieldsNVLink | FieldsHealth
	// FieldsAll is every group.
	FieldsAll = FieldsTick | FieldsCounters | FieldsXID | FieldsProcs
)

// DeviceInfo is what does not change while the collector runs.
type DeviceInfo struct {
	Index    int    `json:"index"` // NVML index of the physical GPU
	UUID     string `json:"uuid"`
	Name     string `json:"name"`
	PCIBusID string `json:"pci_bus_id,omitempty"`
	Minor    int    `json:"minor"` // /dev/nvidia<minor>
	// MIG is set for a MIG instance; its UUID is the instance's own.
	MIG *MIGInfo `json:"mig,omitempty"`
	// GPM tells whether the device supports GPM metrics (Hopper and newer).
	GPM bool `json:"gpm"`
	// GPMNote says why GPM is off, as NVML put it.
	GPMNote string `json:"gpm_note,omitempty"`
}

// MIGInfo describes a MIG instance.
type MIGInfo struct {
	ParentUUID        string `json:"parent_uuid"`
	GPUInstanceID     int    `json:"gpu_instance_id"`
	ComputeInstanceID int    `json:"compute_instance_id"`
	Profile           string `json:"profile"` // e.g. 1g.10gb
}

// Reading is one sample of one device in NVML's units.
type Reading struct {
	TimeUnixMilli int64 `json:"time_unix_ms"`

	UtilGPUPct *uint32 `json:"util_gpu_pct,omitempty"`
	UtilMemPct *uint32 `json:"util_mem_pct,omitempty"`

	MemTotalBytes    *uint64 `json:"mem_total_bytes,omitempty"`
	MemUsedBytes     *uint64 `json:"mem_used_bytes,omitempty"`
	MemFreeBytes     *uint64 `json:"mem_free_bytes,omitempty"`
	MemReservedBytes *uint64 `json:"mem_reserved_bytes,omitempty"`

	PowerMilliW     *uint32   `json:"power_mw,omitempty"`
	EnergyMilliJ    *uint64   `json:"energy_mj,omitempty"` // since driver load
	TempC           *uint32   `json:"temp_c,omitempty"`
	MemTempC        *uint32   `json:"mem_temp_c,omitempty"`
	SMClockMHz      *uint32   `json:"sm_clock_mhz,omitempty"`
	MemClockMHz     *uint32   `json:"mem_clock_mhz,omitempty"`
	PCIeTxKBps      *uint32   `json:"pcie_tx_kbps,omitempty"` // KB/s over NVML's 20 ms window
	PCIeRxKBps      *uint32   `json:"pcie_rx_kbps,omitempty"`
	PCIeReplays     *uint64   `json:"pcie_replays,omitempty"`
	NVLinkTxKiB     *uint64   `json:"nvlink_tx_kib,omitempty"` // counter, all links
	NVLinkRxKiB     *uint64   `json:"nvlink_rx_kib,omitempty"`
	XIDLast         *uint64   `json:"xid_last,omitempty"`
	XIDCount        *uint64   `json:"xid_count,omitempty"` // seen since Init
	ECCCorrected    *uint64   `json:"ecc_corrected,omitempty"`
	ECCUncorrected  *uint64   `json:"ecc_uncorrected,omitempty"`
	RemappedCorr    *uint64   `json:"remapped_rows_correctable,omitempty"`
	RemappedUncorr  *uint64   `json:"remapped_rows_uncorrectable,omitempty"`
	RemapPending    *bool     `json:"remap_pending,omitempty"`
	ClocksEventMask *uint64   `json:"clocks_event_reasons,omitempty"`
	GPMSMActivePct  *float64  `json:"gpm_sm_active_pct,omitempty"`
	GPMSMOccupancy  *float64  `json:"gpm_sm_occupancy_pct,omitempty"`
	GPMTensorPct    *float64  `json:"gpm_tensor_active_pct,omitempty"`
	GPMGraphicsPct  *float64  `json:"gpm_graphics_active_pct,omitempty"`
	GPMDRAMBWPct    *float64  `json:"gpm_dram_bw_util_pct,omitempty"` // DRAM bandwidth used, % of the peak
	Processes       []Process `json:"processes,omitempty"`
}

// Process is a compute process on a device.
type Process struct {
	PID          uint32  `json:"pid"`
	UsedMemBytes *uint64 `json:"used_mem_bytes,omitempty"`
}

// Capture is the file format of recorded readings: Samples[t][d] is the
// reading of Devices[d] at tick t.
type Capture struct {
	Source  string       `json:"source,omitempty"` // driver and tool versions
	Devices []DeviceInfo `json:"devices"`
	Samples [][]Reading  `json:"samples"`
	// Costs is what each NVML call cost on the machine the capture was
	// taken on, by call name; [Fake] replays it.
	Costs map[string]*CallCost `json:"costs,omitempty"`
}

// LoadCapture reads a capture file.
func LoadCapture(path string) (Capture, error) {
	var c Capture
	b, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("nvml: load capture: %w", err)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("nvml: load capture %s: %w", path, err)
	}
	if len(c.Devices) == 0 || len(c.Samples) == 0 {
		return c, fmt.Errorf("nvml: load capture %s: no devices or no samples", path)
	}
	for t, row := range c.Samples {
		if len(row) != len(c.Devices) {
			return c, fmt.Errorf("nvml: load capture %s: sample %d has %d readings for %d devices", path, t, len(row), len(c.Devices))
		}
	}
	return c, nil
}

func ptr[T any](v T) *T { return &v }

// With returns r with the groups in f taken from fresh: the collector
// keeps the last value of the groups it reads less often.
func (r Reading) With(fresh Reading, f Fields) Reading {
	r.TimeUnixMilli = fresh.TimeUnixMilli
	if f&FieldsUtil != 0 {
		r.UtilGPUPct, r.UtilMemPct = fresh.UtilGPUPct, fresh.UtilMemPct
	}
	if f&FieldsMemory != 0 {
		r.MemTotalBytes, r.MemUsedBytes, r.MemFreeBytes, r.MemReservedBytes = fresh.MemTotalBytes, fresh.MemUsedBytes, fresh.MemFreeBytes, fresh.MemReservedBytes
	}
	if f&FieldsPower != 0 {
		r.PowerMilliW = fresh.PowerMilliW
	}
	if f&FieldsTemp != 0 {
		r.TempC, r.MemTempC = fresh.TempC, fresh.MemTempC
	}
	if f&FieldsEnergy != 0 {
		r.EnergyMilliJ = fresh.EnergyMilliJ
	}
	if f&FieldsClocks != 0 {
		r.SMClockMHz, r.MemClockMHz, r.ClocksEventMask = fresh.SMClockMHz, fresh.MemClockMHz, fresh.ClocksEventMask
	}
	if f&FieldsGPM != 0 {
		r.GPMSMActivePct, r.GPMSMOccupancy, r.GPMTensorPct, r.GPMGraphicsPct = fresh.GPMSMActivePct, fresh.GPMSMOccupancy, fresh.GPMTensorPct, fresh.GPMGraphicsPct
		r.GPMDRAMBWPct = fresh.GPMDRAMBWPct
	}
	if f&FieldsPCIe != 0 {
		r.PCIeTxKBps, r.PCIeRxKBps = fresh.PCIeTxKBps, fresh.PCIeRxKBps
	}
	if f&FieldsNVLink != 0 {
		r.NVLinkTxKiB, r.NVLinkRxKiB = fresh.NVLinkTxKiB, fresh.NVLinkRxKiB
	}
	if f&FieldsHealth != 0 {
		r.PCIeReplays, r.ECCCorrected, r.ECCUncorrected = fresh.PCIeReplays, fresh.ECCCorrected, fresh.ECCUncorrected
		r.RemappedCorr, r.RemappedUncorr, r.RemapPending = fresh.RemappedCorr, fresh.RemappedUncorr, fresh.RemapPending
	}
	if f&FieldsXID != 0 {
		r.XIDLast, r.XIDCount = fresh.XIDLast, fresh.XIDCount
	}
	if f&FieldsProcs != 0 {
		r.Processes = fresh.Processes
	}
	return r
}
