package api

// The fast decoder's record kinds: the fields of step, layers and eval
// records, each key at most once, read into one allocation per record
// (stepBox, layersBox, evalBox).

// stepBox holds a step record and everything its pointers point at, so
// that a step costs one allocation.
type stepBox struct {
	s       Step
	step    int64
	samples int64
	tokens  int64
	skipped bool
	time    Time
	syncNS  int64
	floats  [stepFloatSlots]Float
}

// stepFloatSlots is how many float values of [StepFields] a step's box
// holds: every one of them (TestFastDecoderTakesEveryStepFieldAtOnce).
const stepFloatSlots = 24

// onceStr reads a string into *dst, refusing a key seen before.
func (d *fastDecoder) onceStr(seen *bool, dst *string) bool {
	if *seen {
		return false
	}
	*seen = true
	v, ok := d.str()
	*dst = v
	return ok
}

// onceRank reads a rank into *dst, refusing a key seen before.
func (d *fastDecoder) onceRank(seen *bool, dst *int) bool {
	if *seen {
		return false
	}
	*seen = true
	v, ok := d.int64Val()
	*dst = int(v)
	return ok
}

// onceInto reads a value with read into the record's box slot and points
// the record's field at it, refusing a field already set.
func onceInto[T any](field **T, slot *T, read func() (T, bool)) bool {
	if *field != nil {
		return false
	}
	v, ok := read()
	if !ok {
		return false
	}
	*slot = v
	*field = slot
	return true
}

func (d *fastDecoder) step(more bool) (Record, bool) {
	box := &stepBox{}
	s := &box.s
	s.Kind = KindStep
	nf := 0
	var seenRunID, seenRank bool
	for more {
		k, ok := d.key()
		if !ok {
			return Record{}, false
		}
		var fp **Float
		switch string(k) {
		case "run_id":
			if !d.onceStr(&seenRunID, &s.RunID) {
				return Record{}, false
			}
		case "rank":
			if !d.onceRank(&seenRank, &s.Rank) {
				return Record{}, false
			}
		case "step":
			if !onceInto(&s.Step, &box.step, d.int64Val) {
				return Record{}, false
			}
		case "samples":
			if !onceInto(&s.Samples, &box.samples, d.int64Val) {
				return Record{}, false
			}
		case "tokens":
			if !onceInto(&s.Tokens, &box.tokens, d.int64Val) {
				return Record{}, false
			}
		case "sync_ns":
			if !onceInto(&s.SyncNS, &box.syncNS, d.int64Val) {
				return Record{}, false
			}
		case "skipped":
			if !onceInto(&s.Skipped, &box.skipped, d.boolVal) {
				return Record{}, false
			}
		case "time":
			if !onceInto(&s.Time, &box.time, d.timeVal) {
				return Record{}, false
			}
		case "metrics":
			if s.Metrics != nil {
				return Record{}, false
			}
			if s.Metrics, ok = d.metrics(); !ok {
				return Record{}, false
			}
		case "epoch":
			fp = &s.Epoch
		case "loss":
			fp = &s.Loss
		case "lr":
			fp = &s.LR
		case "grad_norm":
			fp = &s.GradNorm
		case "loss_scale":
			fp = &s.LossScale
		case "throughput_sps":
			fp = &s.ThroughputSPS
		case "throughput_tps":
			fp = &s.ThroughputTPS
		case "step_ms":
			fp = &s.StepMS
		case "forward_ms":
			fp = &s.ForwardMS
		case "backward_ms":
			fp = &s.BackwardMS
		case "optimizer_ms":
			fp = &s.OptimizerMS
		case "comm_ms":
			fp = &s.CommMS
		case "comm_exposed_ms":
			fp = &s.CommExposedMS
		case "data_ms":
			fp = &s.DataMS
		case "gpu_util_pct":
			fp = &s.GPUUtilPct
		case "gpu_mem_used_gb":
			fp = &s.GPUMemUsedGB
		case "gpu_mem_peak_gb":
			fp = &s.GPUMemPeakGB
		case "gpu_mem_reserved_gb":
			fp = &s.GPUMemResvGB
		case "cpu_util_pct":
			fp = &s.CPUUtilPct
		case "tflops":
			fp = &s.TFLOPS
		case "mfu":
			fp = &s.MFU
		case "sync_wait_ms":
			fp = &s.SyncWaitMS
		case "input_wait_ms":
			fp = &s.InputWaitMS
		default:
			// "kind" again, unknown keys, keys in another case.
			return Record{}, false
		}
		if fp != nil {
			// A slot short would be a table row the const missed: the
			// general path decodes the record instead.
			if *fp != nil || nf == len(box.floats) {
				return Record{}, false
			}
			v, ok := d.floatVal()
			if !ok {
				return Record{}, false
			}
			box.floats[nf] = v
			*fp = &box.floats[nf]
			nf++
		}
		if more, ok = d.next(); !ok {
			return Record{}, false
		}
	}
	return Record{Step: s}, true
}

type layersBox struct {
	l    Layers
	step int64
	time Time
}

func (d *fastDecoder) layers(more bool) (Record, bool) {
	box := &layersBox{}
	l := &box.l
	l.Kind = KindLayers
	var seenRunID, seenRank bool
	for more {
		k, ok := d.key()
		if !ok {
			return Record{}, false
		}
		switch string(k) {
		case "run_id":
			if !d.onceStr(&seenRunID, &l.RunID) {
				return Record{}, false
			}
		case "rank":
			if !d.onceRank(&seenRank, &l.Rank) {
				return Record{}, false
			}
		case "step":
			if !onceInto(&l.Step, &box.step, d.int64Val) {
				return Record{}, false
			}
		case "time":
			if !onceInto(&l.Time, &box.time, d.timeVal) {
				return Record{}, false
			}
		case "names":
			if l.Names != nil {
				return Record{}, false
			}
			if l.Names, ok = d.stringArray(); !ok {
				return Record{}, false
			}
		case "forward_ms":
			if l.ForwardMS != nil {
				return Record{}, false
			}
			if l.ForwardMS, ok = d.floatArray(); !ok {
				return Record{}, false
			}
		case "backward_ms":
			if l.BackwardMS != nil {
				return Record{}, false
			}
			if l.BackwardMS, ok = d.floatArray(); !ok {
				return Record{}, false
			}
		default:
			return Record{}, false
		}
		if more, ok = d.next(); !ok {
			return Record{}, false
		}
	}
	return Record{Layers: l}, true
}

type evalBox struct {
	e      Eval
	step   int64
	time   Time
	floats [3]Float
}

func (d *fastDecoder) eval(more bool) (Record, bool) {
	box := &evalBox{}
	e := &box.e
	e.Kind = KindEval
	nf := 0
	var seenRunID, seenSplit bool
	for more {
		k, ok := d.key()
		if !ok {
			return Record{}, false
		}
		var fp **Float
		switch string(k) {
		case "run_id":
			if !d.onceStr(&seenRunID, &e.RunID) {
				return Record{}, false
			}
		case "split":
			if !d.onceStr(&seenSplit, &e.Split) {
				return Record{}, false
			}
		case "step":
			if !onceInto(&e.Step, &box.step, d.int64Val) {
				return Record{}, false
			}
		case "time":
			if !onceInto(&e.Time, &box.time, d.timeVal) {
				return Record{}, false
			}
		case "metrics":
			if e.Metrics != nil {
				return Record{}, false
			}
			if e.Metrics, ok = d.metrics(); !ok {
				return Record{}, false
			}
		case "loss":
			fp = &e.Loss
		case "accuracy":
			fp = &e.Accuracy
		case "f1":
			fp = &e.F1
		default:
			return Record{}, false
		}
		if fp != nil {
			// A case added without its slot gives the record to the
			// general path rather than indexing past the box.
			if *fp != nil || nf == len(box.floats) {
				return Record{}, false
			}
			v, ok := d.floatVal()
			if !ok {
				return Record{}, false
			}
			box.floats[nf] = v
			*fp = &box.floats[nf]
			nf++
		}
		if more, ok = d.next(); !ok {
			return Record{}, false
		}
	}
	return Record{Eval: e}, true
}
