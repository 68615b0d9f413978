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
	// Read takes one reading of the device at position i of Devices.
	// Values a device does not support are nil.
	Read(i int) (Reading, error)
}

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
