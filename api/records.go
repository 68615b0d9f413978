// Package api holds the wire types shared by the hook protocol, ingest,
// query, the collector and the Grafana plugin: one definition of each,
// and the table of GPU sample values ([GPUMetrics]) they all read.
//
// Ingest records:
//  1. Decode a batch with [DecodeBatch] (NDJSON or a JSON array, bare NaN
//     and Infinity tokens allowed).
//  2. Every record is validated; the first invalid one is reported as a
//     [*RecordError] naming its index, field and problem.
//  3. Hand the [Record] values to the store.
package api

import (
	"encoding/json"
	"time"
)

// Record kinds accepted by POST /api/v1/ingest.
const (
	KindRun    = "run"
	KindStep   = "step"
	KindLayers = "layers"
	KindEval   = "eval"
	KindGPU    = "gpu"
	KindHost   = "host"
	KindMemory = "memory"
	KindEvent  = "event"
	KindEnd    = "end"
	// KindProcess is sent by the hook to the collector to announce a
	// training process (run_id, rank, local_rank, pid). The server accepts
	// and ignores it.
	KindProcess = "process"
	// KindSteps is many steps of one rank in one record, as columns (see
	// decode_steps.go): how the hook sends the steps it measured without
	// a JSON object per step. It is decoded into step records.
	KindSteps = "steps"
)

// Kinds lists every record kind in a stable order.
var Kinds = []string{KindRun, KindStep, KindLayers, KindEval, KindGPU, KindHost, KindMemory, KindEvent, KindEnd, KindProcess, KindSteps}

// Limits on record contents. A record past any of them is rejected.
const (
	MaxIDLen      = 256       // run_id, project, host, split, type, …
	MaxTextLen    = 65536     // event text, names
	MaxLayers     = 4096      // entries in a layers record
	MaxMetrics    = 256       // entries in a metrics map
	MaxTags       = 64        // tags on a run
	MaxJSONObject = 1 << 20   // bytes of config, meta, params, summary
	MaxCodeText   = 512 << 10 // bytes of the entry script's source, and of the git diff
	MaxRank       = 1 << 20
	MaxStep       = 1 << 53
)

// Run announces a training run. Sending it again updates the run: fields
// present in the newer record replace the stored ones.
type Run struct {
	Kind      string          `json:"kind"`
	RunID     string          `json:"run_id"`
	Project   string          `json:"project,omitempty"`
	Name      string          `json:"name,omitempty"`
	StartedAt *Time           `json:"started_at,omitempty"`
	Config    json.RawMessage `json:"config,omitempty"` // the DeepSpeed config as given
	Meta      *RunMeta        `json:"meta,omitempty"`
	Params    json.RawMessage `json:"params,omitempty"` // hyper-parameters
	Tags      []string        `json:"tags,omitempty"`
	SweepID   string          `json:"sweep_id,omitempty"`
	Code      *RunCode        `json:"code,omitempty"` // sent once; a run record without it keeps what is stored
}

// RunCode is the code that produced a run: the entry script's source and
// the diff of uncommitted changes against meta.git_commit, each cut at
// MaxCodeText bytes by the sender (Truncated, with the full size in Bytes).
type RunCode struct {
	EntryPath       string `json:"entry_path,omitempty"`
	Source          string `json:"source,omitempty"`
	SourceBytes     int64  `json:"source_bytes,omitempty"`
	SourceTruncated bool   `json:"source_truncated,omitempty"`
	GitDiff         string `json:"git_diff,omitempty"`
	GitDiffBytes    int64  `json:"git_diff_bytes,omitempty"`
	GitDiffTrunc    bool   `json:"git_diff_truncated,omitempty"`
}

// RunMeta describes the model, hardware and parallel layout of a run. The
// known fields are typed; anything else a sender adds is kept in Extra.
type RunMeta struct {
	Model          string `json:"model,omitempty"`
	Params         *int64 `json:"params,omitempty"` // parameter count
	GPU            string `json:"gpu,omitempty"`
	GPUMemTotalGB  *Float `json:"gpu_memory_total_gb,omitempty"`
	ZeroStage      *int   `json:"zero_stage,omitempty"`
	Precision      string `json:"precision,omitempty"` // fp32, fp16, bf16
	WorldSize      *int   `json:"world_size,omitempty"`
	MicroBatch     *int   `json:"micro_batch,omitempty"`
	GradAccum      *int   `json:"grad_accum,omitempty"`
	EffectiveBatch *int   `json:"effective_batch,omitempty"`
	PipelineStages *int   `json:"pipeline_stages,omitempty"`
	TensorParallel *int   `json:"tensor_parallel,omitempty"`
	OffloadOptim   string `json:"offload_optimizer,omitempty"` // "", none, cpu, nvme
	OffloadParams  string `json:"offload_params,omitempty"`
	Parallelism    string `json:"parallelism,omitempty"` // data, pipeline, fsdp, ddp, …
	SeqLen         *int   `json:"seq_len,omitempty"`
	FlopsPerToken  *Float `json:"flops_per_token,omitempty"` // training FLOPs per token, model only
	PeakTFLOPS     *Float `json:"peak_tflops,omitempty"`     // dense peak of one GPU at the run's precision
	Epochs         *int   `json:"epochs,omitempty"`
	// TotalSteps is the number of optimizer steps the run will take, when
	// the training script or framework knows it (DeepSpeed's scheduler
	// total_num_steps, the Trainer's max_steps, ...): a running run's
	// estimated time to finish counts the steps left to it.
	TotalSteps *int64                     `json:"total_steps,omitempty"`
	Framework  string                     `json:"framework,omitempty"` // deepspeed, torch, fsdp, lightning, hf
	Command    string                     `json:"command,omitempty"`
	GitCommit  string                     `json:"git_commit,omitempty"`
	JobID      string                     `json:"job_id,omitempty"` // the job that started the run (DEEPSEED_JOB_ID)
	Host       string                     `json:"host,omitempty"`
	Versions   map[string]string          `json:"versions,omitempty"` // python, torch, cuda, deepspeed, …
	Extra      map[string]json.RawMessage `json:"-"`
}

// Step is one optimizer (or micro-) step of one rank. Its values besides
// the key and the user metrics are listed, with their units, sums and
// legends, in [StepFields].
type Step struct {
	Kind          string `json:"kind"`
	RunID         string `json:"run_id"`
	Rank          int    `json:"rank"`
	Step          *int64 `json:"step"`
	Time          *Time  `json:"time,omitempty"`
	Epoch         *Float `json:"epoch,omitempty"`
	Loss          *Float `json:"loss,omitempty"`
	LR            *Float `json:"lr,omitempty"`
	GradNorm      *Float `json:"grad_norm,omitempty"`
	LossScale     *Float `json:"loss_scale,omitempty"`
	Skipped       *bool  `json:"skipped,omitempty"`
	Samples       *int64 `json:"samples,omitempty"`
	Tokens        *int64 `json:"tokens,omitempty"`
	ThroughputSPS *Float `json:"throughput_sps,omitempty"`
	ThroughputTPS *Float `json:"throughput_tps,omitempty"`
	StepMS        *Float `json:"step_ms,omitempty"`
	ForwardMS     *Float `json:"forward_ms,omitempty"`
	BackwardMS    *Float `json:"backward_ms,omitempty"`
	OptimizerMS   *Float `json:"optimizer_ms,omitempty"`
	// CommMS is the time at least one of the step's collectives was in
	// flight; CommExposedMS the part of the step the compute stream spent
	// waiting on communication (not hidden under compute).
	CommMS        *Float `json:"comm_ms,omitempty"`
	CommExposedMS *Float `json:"comm_exposed_ms,omitempty"`
	DataMS        *Float `json:"data_ms,omitempty"`
	GPUUtilPct    *Float `json:"gpu_util_pct,omitempty"`
	GPUMemUsedGB  *Float `json:"gpu_mem_used_gb,omitempty"`
	GPUMemPeakGB  *Float `json:"gpu_mem_peak_gb,omitempty"`     // torch.cuda.max_memory_allocated
	GPUMemResvGB  *Float `json:"gpu_mem_reserved_gb,omitempty"` // torch.cuda.max_memory_reserved
	CPUUtilPct    *Float `json:"cpu_util_pct,omitempty"`
	TFLOPS        *Float `json:"tflops,omitempty"` // achieved model TFLOP/s of this rank's GPU
	MFU           *Float `json:"mfu,omitempty"`    // tflops over the GPU's dense peak, 0..1
	// SyncNS is when the rank reached the step's synchronisation point
	// (the end of its backward), nanoseconds since the Unix epoch on its
	// host clock; SyncWaitMS how long it then waited in the collective;
	// InputWaitMS the host time between steps spent blocked behind the
	// device (not counted in DataMS). See docs/ranks.md.
	SyncNS      *int64           `json:"sync_ns,omitempty"`
	SyncWaitMS  *Float           `json:"sync_wait_ms,omitempty"`
	InputWaitMS *Float           `json:"input_wait_ms,omitempty"`
	Metrics     map[string]Float `json:"metrics,omitempty"`
}

// Layers holds per-layer forward and backward milliseconds of one step of
// one rank, in model order.
type Layers struct {
	Kind       string   `json:"kind"`
	RunID      string   `json:"run_id"`
	Rank       int      `json:"rank"`
	Step       *int64   `json:"step"`
	Time       *Time    `json:"time,omitempty"`
	Names      []string `json:"names"`
	ForwardMS  []Float  `json:"forward_ms"`
	BackwardMS []Float  `json:"backward_ms,omitempty"`
}

// Eval is one evaluation.
type Eval struct {
	Kind     string           `json:"kind"`
	RunID    string           `json:"run_id"`
	Step     *int64           `json:"step"`
	Time     *Time            `json:"time,omitempty"`
	Split    string           `json:"split,omitempty"` // default "val"
	Loss     *Float           `json:"loss,omitempty"`
	Accuracy *Float           `json:"accuracy,omitempty"`
	F1       *Float           `json:"f1,omitempty"`
	Metrics  map[string]Float `json:"metrics,omitempty"`
}

// GPU is one NVML sample of one GPU.
type GPU struct {
	Kind  string `json:"kind"`
	Time  *Time  `json:"time"`
	Host  string `json:"host"`
	GPU   *int   `json:"gpu"` // index
	UUID  string `json:"uuid,omitempty"`
	Name  string `json:"name,omitempty"`
	RunID string `json:"run_id,omitempty"` // when attributed
	Rank  *int   `json:"rank,omitempty"`

	UtilPct           *Float       `json:"util_pct,omitempty"`
	MemUtilPct        *Float       `json:"mem_util_pct,omitempty"`
	MemUsedBytes      *Float       `json:"mem_used_bytes,omitempty"`
	MemTotalBytes     *Float       `json:"mem_total_bytes,omitempty"`
	MemReservedBytes  *Float       `json:"mem_reserved_bytes,omitempty"`
	PowerW            *Float       `json:"power_w,omitempty"`
	EnergyJ           *Float       `json:"energy_j,omitempty"`
	TempC             *Float       `json:"temp_c,omitempty"`
	MemTempC          *Float       `json:"mem_temp_c,omitempty"`
	SMClockMHz        *Float       `json:"sm_clock_mhz,omitempty"`
	MemClockMHz       *Float       `json:"mem_clock_mhz,omitempty"`
	PCIeTxBps         *Float       `json:"pcie_tx_bytes_per_s,omitempty"`
	PCIeRxBps         *Float       `json:"pcie_rx_bytes_per_s,omitempty"`
	PCIeReplays       *Float       `json:"pcie_replay_total,omitempty"`
	NVLinkTxBps       *Float       `json:"nvlink_tx_bytes_per_s,omitempty"`
	NVLinkRxBps       *Float       `json:"nvlink_rx_bytes_per_s,omitempty"`
	XIDLast           *Float       `json:"xid_last,omitempty"`
	XIDTotal          *Float       `json:"xid_total,omitempty"`
	ECCCorrected      *Float       `json:"ecc_corrected_total,omitempty"`
	ECCUncorrected    *Float       `json:"ecc_uncorrected_total,omitempty"`
	RemappedRows      *Float       `json:"remapped_rows_total,omitempty"`
	ThrottleReasons   *int64       `json:"throttle_reasons,omitempty"`     // NVML clocks-event bit mask
	SMActivePct       *Float       `json:"sm_active_pct,omitempty"`        // GPM
	SMOccupancyPct    *Float       `json:"sm_occupancy_pct,omitempty"`     // GPM
	TensorActivePct   *Float       `json:"tensor_active_pct,omitempty"`    // GPM
	GrEngineActivePct *Float       `json:"gr_engine_active_pct,omitempty"` // GPM
	SampleIntervalS   *Float       `json:"sample_interval_s,omitempty"`    // the collector's fast or base interval
	Processes         []GPUProcess `json:"processes,omitempty"`
}

// GPUProcess is one compute process on a GPU.
type GPUProcess struct {
	PID      int64  `json:"pid"`
	MemBytes *Float `json:"mem_bytes,omitempty"`
	RunID    string `json:"run_id,omitempty"`
	Rank     *int   `json:"rank,omitempty"`
}

// Host is one sample of a node's CPU and memory, with the announced
// training processes on it.
type Host struct {
	Kind          string        `json:"kind"`
	Time          *Time         `json:"time"`
	Host          string        `json:"host"`
	CPUUtilPct    *Float        `json:"cpu_util_pct,omitempty"`
	MemUsedBytes  *Float        `json:"mem_used_bytes,omitempty"`
	MemTotalBytes *Float        `json:"mem_total_bytes,omitempty"`
	Load1         *Float        `json:"load1,omitempty"`
	Processes     []HostProcess `json:"processes,omitempty"`
}

// HostProcess is the CPU and resident memory of one training process.
type HostProcess struct {
	PID      int64  `json:"pid"`
	RunID    string `json:"run_id,omitempty"`
	Rank     *int   `json:"rank,omitempty"`
	CPUPct   *Float `json:"cpu_pct,omitempty"`
	RSSBytes *Float `json:"rss_bytes,omitempty"`
}

// Memory is the predicted per-GPU ZeRO memory breakdown of a run.
type Memory struct {
	Kind             string `json:"kind"`
	RunID            string `json:"run_id"`
	Rank             int    `json:"rank"`
	Time             *Time  `json:"time,omitempty"`
	ParametersBytes  *Float `json:"parameters_bytes,omitempty"`
	GradientsBytes   *Float `json:"gradients_bytes,omitempty"`
	OptimizerBytes   *Float `json:"optimizer_bytes,omitempty"`
	OptimizerDevice  string `json:"optimizer_device,omitempty"` // gpu, cpu, nvme
	ParametersDevice string `json:"parameters_device,omitempty"`
	ActivationsBytes *Float `json:"activations_bytes,omitempty"`
}

// ModelStateBytes predicts the per-GPU model-state memory of mixed-precision
// (or fp32) training with ZeRO: parameters and gradients at 2 bytes per
// parameter (4 in fp32), Adam's state at 12 (fp32 master copy, momentum,
// variance; 8 in fp32), with the optimizer state sharded over worldSize
// data-parallel ranks from stage 1, the gradients from stage 2 and the
// parameters from stage 3.
func ModelStateBytes(params float64, precision string, worldSize, stage int) (parameters, gradients, optimizer float64) {
	bpp, opt := 2.0, 12.0
	if precision == "fp32" {
		bpp, opt = 4, 8
	}
	n := float64(max(worldSize, 1))
	parameters, gradients, optimizer = params*bpp, params*bpp, params*opt
	if stage >= 1 {
		optimizer /= n
	}
	if stage >= 2 {
		gradients /= n
	}
	if stage >= 3 {
		parameters /= n
	}
	return parameters, gradients, optimizer
}

// Event is something that happened at a moment of a run.
type Event struct {
	Kind  string `json:"kind"`
	RunID string `json:"run_id"`
	Time  *Time  `json:"time,omitempty"`
	Step  *int64 `json:"step,omitempty"`
	Rank  *int   `json:"rank,omitempty"`
	Type  string `json:"type"` // checkpoint, overflow, restart, note, eval, …
	Text  string `json:"text,omitempty"`
}

// End closes a run.
type End struct {
	Kind    string          `json:"kind"`
	RunID   string          `json:"run_id"`
	Time    *Time           `json:"time,omitempty"`
	Status  string          `json:"status"` // finished, failed, killed
	Summary json.RawMessage `json:"summary,omitempty"`
}

// Process announces a training process to the collector.
type Process struct {
	Kind      string `json:"kind"`
	RunID     string `json:"run_id"`
	Rank      int    `json:"rank"`
	LocalRank int    `json:"local_rank"`
	PID       int64  `json:"pid"`
	Host      string `json:"host,omitempty"`
}

// Record is one decoded ingest record: exactly one field is set.
type Record struct {
	Run     *Run
	Step    *Step
	Layers  *Layers
	Eval    *Eval
	GPU     *GPU
	Host    *Host
	Memory  *Memory
	Event   *Event
	End     *End
	Process *Process
	// Steps holds the step records of one steps record, in its order;
	// ExpandSteps turns them into records of their own.
	Steps []*Step
}

// Kind returns the record's kind.
func (r Record) Kind() string {
	switch {
	case r.Run != nil:
		return KindRun
	case r.Step != nil:
		return KindStep
	case r.Layers != nil:
		return KindLayers
	case r.Eval != nil:
		return KindEval
	case r.GPU != nil:
		return KindGPU
	case r.Host != nil:
		return KindHost
	case r.Memory != nil:
		return KindMemory
	case r.Event != nil:
		return KindEvent
	case r.End != nil:
		return KindEnd
	case r.Process != nil:
		return KindProcess
	case r.Steps != nil:
		return KindSteps
	}
	return ""
}

// RunID returns the run the record belongs to, or "" for unattributed
// GPU and host samples.
func (r Record) RunID() string {
	switch {
	case r.Run != nil:
		return r.Run.RunID
	case r.Step != nil:
		return r.Step.RunID
	case r.Layers != nil:
		return r.Layers.RunID
	case r.Eval != nil:
		return r.Eval.RunID
	case r.GPU != nil:
		return r.GPU.RunID
	case r.Memory != nil:
		return r.Memory.RunID
	case r.Event != nil:
		return r.Event.RunID
	case r.End != nil:
		return r.End.RunID
	case r.Process != nil:
		return r.Process.RunID
	case len(r.Steps) > 0:
		return r.Steps[0].RunID
	}
	return ""
}

// Run statuses.
const (
	StatusRunning  = "running"
	StatusFinished = "finished"
	StatusFailed   = "failed"
	StatusKilled   = "killed"
)

// Now is the clock used to stamp records that carry no time. Tests may
// replace it.
var Now = func() time.Time { return time.Now().UTC() }
