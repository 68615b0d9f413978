package api

// StepField is one value of a step record, defined once for every part
// that handles it: the validator checks it, the store writes its column
// and rolls it up, the query API gives its unit, the Grafana plugin lists
// it and names it in a legend, and the API document and docs/metrics.md
// describe it.
//
// Adding a step value is a row in [StepFields] with its field in [Step], a
// migration adding its column to steps, and the hook sending it; `go test
// ./api ./grafana-plugin/pkg/plugin -update` then writes what is derived
// from the table in files (openapi.json, docs/metrics.md, the plugin
// editor's list), and the fast decoder's switch (decode_fast_kinds.go)
// gets its case, which a test asks for.
type StepField struct {
	// Name is the value's name in a step record, its steps column and its
	// name as a series of the query API (/runs/{id}/series?metric=).
	Name string
	// Unit is the unit as the query API names it: ms, percent, GB,
	// samples/s, tokens/s, samples, tokens, epoch, TFLOP/s, ratio, ns;
	// "" for numbers without one (loss, learning rate). A value in ms is
	// a duration, which the validator refuses when negative.
	Unit string
	// Sum is how a bucket of steps sums the value up.
	Sum StepSum
	// Label is a chart legend in words; "" shows the name.
	Label string
	// Group is what part of a step the value describes.
	Group StepGroup
	// Field is the value's field in a record: a **Float, a **int64 (a
	// count, never negative) or a **bool.
	Field func(s *Step) any
}

// StepSum is how a bucket of steps sums a step value up.
type StepSum int

const (
	// StepMean: the value is a series whose buckets hold min, max, sum and
	// count; a bucket shows the mean.
	StepMean StepSum = iota
	// StepCount: a flag; a bucket counts the steps that set it.
	StepCount
	// StepStored: stored for the analyses that read it (a clock reading),
	// not a series.
	StepStored
)

// StepGroup is the part of a step a value describes.
type StepGroup string

// The groups of [StepField.Group].
const (
	GroupTraining   StepGroup = "training"   // the optimizer's view: loss, learning rate, gradient
	GroupProgress   StepGroup = "progress"   // how far the run is: samples, tokens
	GroupThroughput StepGroup = "throughput" // work per second
	GroupPhase      StepGroup = "phase"      // the step's time and its phases
	GroupComm       StepGroup = "comm"       // collectives
	GroupResources  StepGroup = "resources"  // GPU and CPU as the training process sees them
	GroupSync       StepGroup = "sync"       // the ranks' meeting at the synchronisation point
)

// StepFields is every value of a step record but its key (run, rank,
// step, time) and its user metrics, in the order the query editor lists
// them.
var StepFields = []StepField{
	{Name: "loss", Label: "loss", Group: GroupTraining, Field: func(s *Step) any { return &s.Loss }},
	{Name: "lr", Label: "learning rate", Group: GroupTraining, Field: func(s *Step) any { return &s.LR }},
	{Name: "grad_norm", Label: "gradient norm", Group: GroupTraining, Field: func(s *Step) any { return &s.GradNorm }},
	{Name: "loss_scale", Label: "loss scale", Group: GroupTraining, Field: func(s *Step) any { return &s.LossScale }},
	{Name: "epoch", Unit: "epoch", Label: "epoch", Group: GroupTraining, Field: func(s *Step) any { return &s.Epoch }},
	{Name: "samples", Unit: "samples", Label: "samples", Group: GroupProgress, Field: func(s *Step) any { return &s.Samples }},
	{Name: "tokens", Unit: "tokens", Label: "tokens", Group: GroupProgress, Field: func(s *Step) any { return &s.Tokens }},
	{Name: "throughput_sps", Unit: "samples/s", Label: "samples/s", Group: GroupThroughput, Field: func(s *Step) any { return &s.ThroughputSPS }},
	{Name: "throughput_tps", Unit: "tokens/s", Label: "tokens/s", Group: GroupThroughput, Field: func(s *Step) any { return &s.ThroughputTPS }},
	{Name: "step_ms", Unit: "ms", Label: "step", Group: GroupPhase, Field: func(s *Step) any { return &s.StepMS }},
	{Name: "forward_ms", Unit: "ms", Label: "forward", Group: GroupPhase, Field: func(s *Step) any { return &s.ForwardMS }},
	{Name: "backward_ms", Unit: "ms", Label: "backward", Group: GroupPhase, Field: func(s *Step) any { return &s.BackwardMS }},
	{Name: "optimizer_ms", Unit: "ms", Label: "optimizer", Group: GroupPhase, Field: func(s *Step) any { return &s.OptimizerMS }},
	{Name: "comm_ms", Unit: "ms", Label: "communication", Group: GroupComm, Field: func(s *Step) any { return &s.CommMS }},
	{Name: "comm_exposed_ms", Unit: "ms", Group: GroupComm, Field: func(s *Step) any { return &s.CommExposedMS }},
	{Name: "data_ms", Unit: "ms", Label: "data loading", Group: GroupPhase, Field: func(s *Step) any { return &s.DataMS }},
	{Name: "gpu_util_pct", Unit: "percent", Label: "GPU utilisation (steps)", Group: GroupResources, Field: func(s *Step) any { return &s.GPUUtilPct }},
	{Name: "gpu_mem_used_gb", Unit: "GB", Label: "GPU memory used (steps)", Group: GroupResources, Field: func(s *Step) any { return &s.GPUMemUsedGB }},
	{Name: "gpu_mem_peak_gb", Unit: "GB", Label: "peak allocated (PyTorch)", Group: GroupResources, Field: func(s *Step) any { return &s.GPUMemPeakGB }},
	{Name: "gpu_mem_reserved_gb", Unit: "GB", Label: "reserved (PyTorch)", Group: GroupResources, Field: func(s *Step) any { return &s.GPUMemResvGB }},
	{Name: "cpu_util_pct", Unit: "percent", Label: "CPU utilisation", Group: GroupResources, Field: func(s *Step) any { return &s.CPUUtilPct }},
	{Name: "tflops", Unit: "TFLOP/s", Label: "TFLOP/s", Group: GroupThroughput, Field: func(s *Step) any { return &s.TFLOPS }},
	{Name: "mfu", Unit: "ratio", Label: "MFU", Group: GroupThroughput, Field: func(s *Step) any { return &s.MFU }},
	{Name: "sync_wait_ms", Unit: "ms", Label: "wait in collective", Group: GroupSync, Field: func(s *Step) any { return &s.SyncWaitMS }},
	{Name: "input_wait_ms", Unit: "ms", Label: "input wait", Group: GroupSync, Field: func(s *Step) any { return &s.InputWaitMS }},
	{Name: "skipped", Sum: StepCount, Label: "skipped", Group: GroupTraining, Field: func(s *Step) any { return &s.Skipped }},
	{Name: "sync_ns", Unit: "ns", Sum: StepStored, Group: GroupSync, Field: func(s *Step) any { return &s.SyncNS }},
}

// StepFieldNamed returns the table's row of a step value, or nil.
func StepFieldNamed(name string) *StepField {
	for i := range StepFields {
		if StepFields[i].Name == name {
			return &StepFields[i]
		}
	}
	return nil
}

// StepSeries lists the step values whose buckets hold a mean (the
// table's StepMean rows), in the table's order.
func StepSeries() []string {
	var out []string
	for _, f := range StepFields {
		if f.Sum == StepMean {
			out = append(out, f.Name)
		}
	}
	return out
}

// stepDurations and stepCounts are the step table's fields the validator
// checks, picked out once: its values in ms and its integers.
var stepDurations, stepCounts = func() (d []StepField, c []StepField) {
	for _, f := range StepFields {
		switch f.Field(&Step{}).(type) {
		case **Float:
			if f.Unit == "ms" {
				d = append(d, f)
			}
		case **int64:
			c = append(c, f)
		}
	}
	return d, c
}()

// stepFields checks a step's values by the table: durations (unit ms)
// and counts (integers) are never negative. Durations are checked first,
// so a step with both wrong is refused for its duration.
func (v *validator) stepFields(s *Step) {
	for _, f := range stepDurations {
		if p := f.Field(s).(**Float); *p != nil && float64(**p) < 0 {
			v.fail(f.Name, "negative duration")
		}
	}
	for _, f := range stepCounts {
		if p := f.Field(s).(**int64); *p != nil && **p < 0 {
			v.fail(f.Name, "negative")
		}
	}
}
