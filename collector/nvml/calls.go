package nvml

// call names one NVML call that Read makes. [Real] times each under its
// name when recording costs, and remembers per device the ones it answered
// as unsupported so it never makes them again; [Fake] replays the recorded
// cost of the calls Real would have made for the same fields.
type call uint8

const (
	callUtil call = iota
	callMemoryV2
	callMemory
	callPower
	callEnergy
	callTemp
	callMemTemp
	callClockSM
	callClockMem
	callClocksEvent
	callGPMSample
	callGPMMetrics
	callPCIeTx
	callPCIeRx
	callNVLink
	callPCIeReplay
	callECCCorrected
	callECCUncorrected
	callRemapped
	callEvents
	callProcs
	numCalls
)

var callNames = [numCalls]string{
	callUtil:           "utilization",
	callMemoryV2:       "memory_info_v2",
	callMemory:         "memory_info",
	callPower:          "power_usage",
	callEnergy:         "total_energy",
	callTemp:           "temperature",
	callMemTemp:        "field_memory_temp",
	callClockSM:        "clock_sm",
	callClockMem:       "clock_mem",
	callClocksEvent:    "clocks_event_reasons",
	callGPMSample:      "gpm_sample",
	callGPMMetrics:     "gpm_metrics",
	callPCIeTx:         "pcie_throughput_tx",
	callPCIeRx:         "pcie_throughput_rx",
	callNVLink:         "field_nvlink_throughput",
	callPCIeReplay:     "pcie_replay_counter",
	callECCCorrected:   "ecc_corrected",
	callECCUncorrected: "ecc_uncorrected",
	callRemapped:       "remapped_rows",
	callEvents:         "event_set_wait",
	callProcs:          "compute_processes",
}

// fieldCalls lists, for each group of Fields, the calls Read makes for it,
// in order. Calls that need a capability (a physical GPU, NVLink links,
// GPM) are left out by Read where the device lacks it.
var fieldCalls = []struct {
	f     Fields
	calls []call
}{
	{FieldsUtil, []call{callUtil}},
	{FieldsMemory, []call{callMemoryV2, callMemory}},
	{FieldsPower, []call{callPower}},
	{FieldsTemp, []call{callTemp, callMemTemp}},
	{FieldsClocks, []call{callClockSM, callClockMem, callClocksEvent}},
	{FieldsGPM, []call{callGPMSample, callGPMMetrics}},
	{FieldsEnergy, []call{callEnergy}},
	{FieldsPCIe, []call{callPCIeTx, callPCIeRx}},
	{FieldsNVLink, []call{callNVLink}},
	{FieldsHealth, []call{callPCIeReplay, callECCCorrected, callECCUncorrected, callRemapped}},
	{FieldsXID, []call{callEvents}},
	{FieldsProcs, []call{callProcs}},
}

// callSet is a set of calls, one bit each.
type callSet uint32

func (s callSet) has(c call) bool { return s&(1<<c) != 0 }
func (s *callSet) add(c call)     { *s |= 1 << c }
