package api

import (
	"encoding/json"
	"time"
)

// Error is the body of every 4xx and 5xx answer.
type Error struct {
	Error string `json:"error"`
	// Param names the query parameter at fault, for 400 answers of the
	// query API.
	Param string `json:"param,omitempty"`
	// Record details a rejected ingest record.
	Record *RecordError `json:"record,omitempty"`
}

// IngestResult answers a successful POST /api/v1/ingest or /api/v1/import.
type IngestResult struct {
	Accepted   int            `json:"accepted"`
	Duplicates int            `json:"duplicates"`
	ByKind     map[string]int `json:"by_kind,omitempty"`
	RunIDs     []string       `json:"run_ids,omitempty"` // import: the run created
}

// RunList answers GET /api/v1/runs.
type RunList struct {
	Runs   []RunSummary `json:"runs"`
	Total  int          `json:"total"`
	Limit  int          `json:"limit"`
	Offset int          `json:"offset"`
}

// RunSummary is one run with the figures of the seed dashboard's summary
// cards. Figures that cannot be computed yet are null.
type RunSummary struct {
	RunID      string     `json:"run_id"`
	Project    string     `json:"project"`
	Name       string     `json:"name"`
	Status     string     `json:"status"`
	Tags       []string   `json:"tags"`
	SweepID    string     `json:"sweep_id,omitempty"`
	StartedAt  *time.Time `json:"started_at"`
	EndedAt    *time.Time `json:"ended_at"`
	DurationS  *Float     `json:"duration_s"`
	LastSeenAt *time.Time `json:"last_seen_at"`

	Model          string `json:"model"`
	ParamCount     *int64 `json:"param_count"`
	GPU            string `json:"gpu"`
	ZeroStage      *int   `json:"zero_stage"`
	Precision      string `json:"precision"`
	MicroBatch     *int   `json:"micro_batch"`
	GradAccum      *int   `json:"grad_accum"`
	EffectiveBatch *int   `json:"effective_batch"`
	WorldSize      *int   `json:"world_size"`
	PipelineStages *int   `json:"pipeline_stages"`
	OffloadOptim   string `json:"offload_optimizer"`
	OffloadParams  string `json:"offload_params"`

	Steps             int64  `json:"steps"`     // number of distinct steps recorded (rank 0 or any)
	LastStep          *int64 `json:"last_step"` // highest step recorded
	FinalLoss         *Float `json:"final_loss"`
	BestValAccuracy   *Float `json:"best_val_accuracy"`
	FinalValAccuracy  *Float `json:"final_val_accuracy"`
	BestValF1         *Float `json:"best_val_f1"`
	FinalValF1        *Float `json:"final_val_f1"`
	FinalValLoss      *Float `json:"final_val_loss"`
	MeanThroughputSPS *Float `json:"mean_throughput_sps"`
	// MeanGPUUtilPct is the mean GPU utilisation the steps carried, else
	// that of the NVML samples the collectors attributed to the run.
	MeanGPUUtilPct *Float `json:"mean_gpu_util_pct"`
	// PeakGPUMemGB is the most device memory in use as NVML counts it (the
	// allocator's pool plus the CUDA context): the highest of the run's GPU
	// samples and of the steps' gpu_mem_used_gb.
	PeakGPUMemGB *Float `json:"peak_gpu_mem_gb"`
	// PeakGPUMemAllocGB is the PyTorch allocator's peak
	// (max_memory_allocated) the hook measured on any rank: the tensors
	// alone, below the NVML figure.
	PeakGPUMemAllocGB *Float `json:"peak_gpu_mem_alloc_gb"`
	MeanStepMS        *Float `json:"mean_step_ms"`
	MeanTFLOPS        *Float `json:"mean_tflops"` // achieved model TFLOP/s per GPU
	MeanMFU           *Float `json:"mean_mfu"`    // model FLOPs utilisation, 0..1
	SkippedSteps      int64  `json:"skipped_steps"`

	// TotalSteps is the steps the run will take, from its meta, when known.
	TotalSteps *int64 `json:"total_steps"`
	// ETASeconds estimates, for a running run whose total steps are known,
	// the time left to finish: the steps left (total_steps - last_step)
	// times the steady-state mean step time of its first rank. ETAAt is
	// that time after the run's last record.
	ETASeconds *Float     `json:"eta_s"`
	ETAAt      *time.Time `json:"eta_at"`

	// RollupLag is present while the run's rollups are behind its raw
	// rows (a bulk load, ingest outrunning the refresher): the figures
	// above count what was rolled up when the answer was made.
	RollupLag *RollupLag `json:"rollup_lag,omitempty"`
}

// RollupLag says how far a run's rollups are behind its raw rows
// (docs/scale.md): the rank-blocks of 100 steps written since their last
// refresh, and how long the oldest of them has waited. The same figures
// go, for every answer that reads rollups, in the headers
// X-DeepSeed-Rollup-Lag (seconds) and X-DeepSeed-Rollup-Lag-Blocks.
type RollupLag struct {
	Blocks  int64 `json:"blocks"`
	BehindS Float `json:"behind_s"`
}

// RunDetail answers GET /api/v1/runs/{id}: the summary plus the seed's
// "training notebook" — config, hyper-parameters, command line, git
// commit and library versions.
type RunDetail struct {
	RunSummary
	Meta      json.RawMessage   `json:"meta"`
	Config    json.RawMessage   `json:"config"`
	Params    json.RawMessage   `json:"params"`
	Summary   json.RawMessage   `json:"summary"`
	Command   string            `json:"command"`
	GitCommit string            `json:"git_commit"`
	Versions  map[string]string `json:"versions"`
	Host      string            `json:"host"`
	Ranks     []int             `json:"ranks"`
	Metrics   []string          `json:"metrics"` // user metric names, as metrics.NAME
	// OpenAlerts counts the run's alerts open now (GET /alerts lists them).
	OpenAlerts int64 `json:"open_alerts"`
	// Wasted is the GPU time the run wasted, by cause.
	Wasted WastedGPUHours `json:"wasted"`
	// Consistency lists the invariants the run's records break (docs/
	// metrics.md): empty when every check passed or had nothing to read.
	Consistency []ConsistencyCheck `json:"consistency"`
	// ReplicaLagS is, for a running run read from a hot standby, how many
	// seconds the standby's data is behind the primary's; absent
	// elsewhere (docs/scale-out.md).
	ReplicaLagS *Float `json:"replica_lag_s,omitempty"`
}

// ConsistencyCheck is one invariant a run's records break: its name
// (one of the Check* constants), what was seen, how many steps show it and
// a sentence saying what it means.
type ConsistencyCheck struct {
	Check string `json:"check"`
	Seen  string `json:"seen"`
	Steps int64  `json:"steps"`
	Text  string `json:"text"`
}

// The consistency checks of a run.
const (
	CheckMFURange      = "mfu_range"          // MFU in (0, 1]
	CheckPhases        = "phases_within_step" // forward, backward, optimizer each and together within the step
	CheckOptimizerStep = "optimizer_steps"    // a step is an optimizer step, not a micro-step
	CheckPrecision     = "precision"          // the precision recorded is the one the run declares
)

// WastedGPUHours is the GPU-hours a run wasted, by cause (docs/ranks.md):
// GPUs idle below 10 % utilisation, waiting on a straggler at the
// synchronisation point, stalled (no step for the stall limit) and spent
// on skipped (overflow) steps. Total is their sum.
type WastedGPUHours struct {
	Idle      Float `json:"idle"`
	Straggler Float `json:"straggler"`
	Stalled   Float `json:"stalled"`
	Skipped   Float `json:"skipped"`
	Total     Float `json:"total"`
}

// RunCodeResponse answers GET /api/v1/runs/{id}/code: the code that
// produced the run, empty fields when none was sent.
type RunCodeResponse struct {
	RunID string `json:"run_id"`
	RunCode
}

// SeriesResponse answers GET /api/v1/runs/{id}/series.
type SeriesResponse struct {
	RunID     string   `json:"run_id"`
	MaxPoints int      `json:"max_points"`
	Series    []Series `json:"series"`
	// With rank=all on a run of more than MaxRankSeries ranks, the ranks
	// come back as a distribution per metric (Spread) and Series holds
	// only the ranks a user must see: the top ranks by the metric's mean
	// over the run (top=, 3 by default) and any named beside all
	// (rank=all&rank=7). Ranks is then the number of ranks of the run
	// and Notice says so.
	Spread []SeriesSpread `json:"spread,omitempty"`
	Ranks  int            `json:"ranks,omitempty"`
	Notice string         `json:"notice,omitempty"`
	// ReplicaLagS is as in RunDetail.
	ReplicaLagS *Float `json:"replica_lag_s,omitempty"`
}

// MaxRankSeries is the most ranks for which rank=all answers one series
// per rank.
const MaxRankSeries = 16

// SeriesSpread is the distribution of one metric over the ranks of a run,
// bucket by bucket (each point BucketSteps steps, at least 100).
type SeriesSpread struct {
	Metric      string        `json:"metric"`
	Unit        string        `json:"unit"`
	BucketSteps int64         `json:"bucket_steps"`
	Points      []SpreadPoint `json:"points"`
}

// SpreadPoint is one bucket of a SeriesSpread: the lowest, 5th
// percentile, median, 95th percentile and highest of the ranks' means over
// the bucket, the mean over every rank's values, how many ranks reported,
// and the rank with the highest mean. In a bucket wider than the rollup it
// reads, the percentiles are the count-weighted means of the rollups'.
type SpreadPoint struct {
	Step    int64     `json:"step"`
	Time    time.Time `json:"time"`
	Min     Float     `json:"min"`
	P5      Float     `json:"p5"`
	Median  Float     `json:"median"`
	P95     Float     `json:"p95"`
	Max     Float     `json:"max"`
	Mean    Float     `json:"mean"`
	Ranks   int       `json:"ranks"`
	MaxRank int       `json:"max_rank"`
}

// Series is one metric of one rank. When downsampled, each point stands
// for a bucket of BucketSteps consecutive steps: Value is the mean, Min
// and Max the extremes, Step and Time those of the bucket's first row.
type Series struct {
	Metric      string  `json:"metric"`
	Rank        int     `json:"rank"`
	Unit        string  `json:"unit"` // ms, percent, GB, …; "" when none
	BucketSteps int64   `json:"bucket_steps"`
	Points      []Point `json:"points"`
}

// Point is one (possibly aggregated) value. NaN and infinite values travel
// as the strings "NaN", "Infinity", "-Infinity".
type Point struct {
	Step  int64     `json:"step"`
	Time  time.Time `json:"time"`
	Value Float     `json:"value"`
	Min   Float     `json:"min"`
	Max   Float     `json:"max"`
	Count int64     `json:"count"`
}

// Heatmap answers GET /api/v1/runs/{id}/heatmap: Values[i][j] is the mean
// milliseconds of layer Layers[i] over the steps of bucket j, which starts
// at Steps[j] (at Times[j]); null where the bucket has no sample.
type Heatmap struct {
	RunID       string      `json:"run_id"`
	Pass        string      `json:"pass"` // forward or backward
	Rank        int         `json:"rank"`
	Layers      []string    `json:"layers"`
	Steps       []int64     `json:"steps"`
	Times       []time.Time `json:"times"`
	BucketSteps int64       `json:"bucket_steps"`
	Values      [][]*Float  `json:"values"`
	// Notice says why there are no cells, e.g. "no backward timings"
	// for a run whose layer records have forward times only.
	Notice string `json:"notice,omitempty"`
}

// EvalsResponse answers GET /api/v1/runs/{id}/evals.
type EvalsResponse struct {
	RunID string      `json:"run_id"`
	Evals []EvalPoint `json:"evals"`
}

// EvalPoint is one evaluation with the training loss at (or just before)
// its step, for the overlay on the loss chart.
type EvalPoint struct {
	Step      int64            `json:"step"`
	Time      time.Time        `json:"time"`
	Split     string           `json:"split"`
	Loss      *Float           `json:"loss"`
	Accuracy  *Float           `json:"accuracy"`
	F1        *Float           `json:"f1"`
	Metrics   map[string]Float `json:"metrics,omitempty"`
	TrainLoss *Float           `json:"train_loss"`
}

// Breakdown answers GET /api/v1/runs/{id}/breakdown: the compute-time
// donut over the steady state.
type Breakdown struct {
	RunID    string          `json:"run_id"`
	Rank     int             `json:"rank"`
	FromStep int64           `json:"from_step"` // first step of the steady state
	ToStep   int64           `json:"to_step"`
	Steps    int64           `json:"steps"`   // rows averaged
	StepMS   Float           `json:"step_ms"` // mean step time
	Parts    []BreakdownPart `json:"parts"`   // forward, backward, optimizer, communication, data, other
	// CommMS is the mean time a collective was in flight, hidden under
	// compute or not; the communication part is the exposed share of it
	// (comm_exposed_ms) where the sender measured that. Null when unknown.
	CommMS *Float `json:"comm_ms"`
}

// BreakdownPart is one slice of the donut. Shares sum to 100.
type BreakdownPart struct {
	Name     string `json:"name"`
	MS       Float  `json:"ms"`
	SharePct Float  `json:"share_pct"`
}

// MemoryResponse answers GET /api/v1/runs/{id}/memory.
type MemoryResponse struct {
	RunID             string       `json:"run_id"`
	Parts             []MemoryPart `json:"parts"` // parameters, gradients, optimizer, activations
	PredictedGPUBytes Float        `json:"predicted_gpu_bytes"`
	PeakGPUBytes      *Float       `json:"peak_gpu_bytes"`       // NVML: device memory in use, from GPU samples or steps
	AllocPeakGPUBytes *Float       `json:"alloc_peak_gpu_bytes"` // the PyTorch allocator's peak the hook measured
	GPUTotalBytes     *Float       `json:"gpu_total_bytes"`
}

// MemoryPart is one bar of the ZeRO breakdown.
type MemoryPart struct {
	Name   string `json:"name"`
	Bytes  Float  `json:"bytes"`
	Device string `json:"device"` // gpu, cpu, nvme
}

// RanksResponse answers GET /api/v1/runs/{id}/ranks.
type RanksResponse struct {
	RunID        string `json:"run_id"`
	MedianStepMS Float  `json:"median_step_ms"`
	StragglerPct Float  `json:"straggler_pct"` // the margin used
	// LatenessFrom says what lateness came from: "arrivals" (the ranks'
	// arrival times at the synchronisation point), "waits" (their waits in
	// the collective) or "" (neither recorded: the straggler flag then
	// falls back to step times, which synchronous training makes equal).
	LatenessFrom string `json:"lateness_from"`
	// FromStep is the first step summarised (the steady state's, or
	// from_step). Basis says how: "steps" (every raw row: medians as
	// named) or "rollups" (runs past a few thousand rank-steps: the
	// per-rank figures are means over whole blocks of 100 steps from the
	// block holding FromStep, median_step_ms is the mean step time,
	// p95_step_ms and clock_offset_ms are null; docs/scale.md).
	FromStep int64  `json:"from_step"`
	Basis    string `json:"basis"`
	// OwnThresholdMS is the own-work excess above which a rank is named
	// when lateness names nobody (straggler_pct % of the median step, at
	// least 1 ms; docs/ranks.md), null when the steps carry no phases.
	OwnThresholdMS *Float     `json:"own_threshold_ms"`
	Ranks          []RankStat `json:"ranks"`
	// Hosts rolls the ranks up by host, the slowest first, so that a slow
	// node shows as one row.
	Hosts []HostStat `json:"hosts"`
}

// HostStat is the ranks of one host in GET /runs/{id}/ranks.
type HostStat struct {
	Host           string `json:"host"` // "" for ranks of no known host
	Ranks          int    `json:"ranks"`
	Stragglers     int    `json:"stragglers"`      // ranks flagged
	WorstRank      int    `json:"worst_rank"`      // the rank with the largest lateness (or step time)
	MaxLatenessMS  *Float `json:"max_lateness_ms"` // null without lateness
	MeanLatenessMS *Float `json:"mean_lateness_ms"`
	MaxStepMS      *Float `json:"max_step_ms"`
	MeanGPUUtil    *Float `json:"mean_gpu_util_pct"`
	MaxScore       *Float `json:"max_straggler_score"`
}

// RankStat is one rank's steady-state timing.
type RankStat struct {
	Rank         int    `json:"rank"`
	Host         string `json:"host,omitempty"`
	Steps        int64  `json:"steps"`
	MedianStepMS Float  `json:"median_step_ms"`
	P95StepMS    Float  `json:"p95_step_ms"`
	MeanGPUUtil  *Float `json:"mean_gpu_util_pct"`
	PeakMemGB    *Float `json:"peak_gpu_mem_gb"`
	WaitMS       Float  `json:"wait_ms"` // mean time spent waiting on slower ranks
	Straggler    bool   `json:"straggler"`
	// Per-rank truth under synchronous training (docs/ranks.md), medians
	// over the steady steps every rank reported; null when not recorded.
	LatenessMS     *Float `json:"lateness_ms"`     // arrival at the synchronisation point after the first rank's
	BusyMS         *Float `json:"busy_ms"`         // step time less the wait in the collective
	SyncWaitMS     *Float `json:"sync_wait_ms"`    // wait in the collective at the end of backward
	InputWaitMS    *Float `json:"input_wait_ms"`   // mean host time blocked behind the device between steps
	LastPct        *Float `json:"last_pct"`        // share of steps it arrived last, percent
	ClockOffsetMS  *Float `json:"clock_offset_ms"` // estimated offset of its host clock
	StragglerScore *Float `json:"straggler_score"` // newest EWMA of lateness over busy time, a fraction of a step
	// Own work (docs/ranks.md), medians over the window's steps: how much
	// longer the rank's own data, host and device work is than the
	// median rank's, the part it is mostly in (OwnCause: "data", "host"
	// or "gpu", "" below the threshold), and the wait for the slowest
	// rank hidden in its forward and backward.
	OwnExcessMS  *Float `json:"own_excess_ms"`
	OwnCause     string `json:"own_cause,omitempty"`
	HiddenWaitMS *Float `json:"hidden_wait_ms"`
	// DelayMS is how long the rank holds the others back a step: its
	// lateness when lateness names a straggler, else its own excess.
	DelayMS *Float `json:"delay_ms"`
	// StragglerBy says which signal named the rank: "lateness",
	// "own_work" or "step_time"; "" when it is no straggler.
	StragglerBy string `json:"straggler_by,omitempty"`
}

// CompareResponse answers GET /api/v1/compare.
type CompareResponse struct {
	Baseline string       `json:"baseline,omitempty"`
	Rows     []CompareRow `json:"rows"`
}

// CompareRow is one run's configuration and steady-state figures, as in
// the tables of the experiment report.
type CompareRow struct {
	RunID          string `json:"run_id"`
	Name           string `json:"name"`
	Project        string `json:"project"`
	Status         string `json:"status"`
	Model          string `json:"model"`
	ZeroStage      *int   `json:"zero_stage"`
	Precision      string `json:"precision"`
	PipelineStages *int   `json:"pipeline_stages"`
	Parallelism    string `json:"parallelism"`
	OffloadOptim   string `json:"offload_optimizer"`
	OffloadParams  string `json:"offload_params"`
	MicroBatch     *int   `json:"micro_batch"`
	WorldSize      *int   `json:"world_size"`

	// GPU memory as NVML counts it (the allocator's pool plus the CUDA
	// context): the peak and the mean over the steady state, in MB.
	GPUMemPeakMB *Float `json:"gpu_mem_peak_mb"`
	GPUMemMeanMB *Float `json:"gpu_mem_mean_mb"`
	// GPUMemAllocPeakMB is the torch allocator's peak (max_memory_allocated)
	// the hook measured, over every rank: the tensors alone.
	GPUMemAllocPeakMB *Float `json:"gpu_mem_alloc_peak_mb"`
	GPUUtilPct        *Float `json:"gpu_util_pct"`
	// CPUUtilPct is the host's CPU utilisation (all of its CPUs, 0..100)
	// on the nodes the run's ranks ran on, not the processes' CPU.
	CPUUtilPct  *Float `json:"cpu_util_pct"`
	StepTimeS   *Float `json:"step_time_s"`
	StepsPerS   *Float `json:"steps_per_s"`
	SamplesPerS *Float `json:"samples_per_s"`
	// CommMS is the mean time per step a collective was in flight,
	// CommExposedMS the mean time per step the compute stream waited on
	// communication, both over the ranks (docs/ranks.md).
	CommMS        *Float `json:"comm_ms"`
	CommExposedMS *Float `json:"comm_exposed_ms"`
	TFLOPS        *Float `json:"tflops"` // mean achieved model TFLOP/s per GPU
	MFU           *Float `json:"mfu"`    // mean model FLOPs utilisation, 0..1
	FinalLoss     *Float `json:"final_loss"`
	BestEvalAcc   *Float `json:"best_eval_accuracy"`
	// WastedGPUH is Wasted.Total, a figure delta_pct compares.
	WastedGPUH *Float          `json:"wasted_gpu_h"`
	Wasted     *WastedGPUHours `json:"wasted"`

	// Sources names, for each figure that has a value, where it came from
	// (one of the Source* constants), keyed by the figure's JSON name.
	Sources map[string]string `json:"sources"`
	// Note says, in words, which figures fell back to readings outside
	// the steady state or to the hook's own; empty when none did.
	Note string `json:"note,omitempty"`

	// Delta holds, when a baseline is named, each figure's relative change
	// against the baseline in percent, keyed by the figure's JSON name.
	DeltaPct map[string]*Float `json:"delta_pct,omitempty"`
}

// Where a compare figure came from ([CompareRow.Sources]).
const (
	// SourceSteps: the step records of the steady state (final_loss: the
	// run's last step).
	SourceSteps = "steps"
	// SourceEvals: the run's evaluation records (best_eval_accuracy).
	SourceEvals = "evals"
	// SourceGPUSamples: the collector's GPU samples attributed to the run
	// within the steady state.
	SourceGPUSamples = "gpu_samples"
	// SourceGPUSamplesRun: GPU samples attributed to the run outside the
	// steady state (none fell inside it).
	SourceGPUSamplesRun = "gpu_samples_run"
	// SourceHostSamples: the host samples of the run's nodes within the
	// steady state.
	SourceHostSamples = "host_samples"
	// SourceHostSamplesNear: host samples of the run's nodes just outside
	// the steady state (within [CompareNearWindow]).
	SourceHostSamplesNear = "host_samples_near"
	// SourceHookReserved and SourceHookAllocated: the hook's allocator
	// peaks (reserved, allocated) standing in for NVML's memory in use.
	SourceHookReserved  = "hook_reserved_peak"
	SourceHookAllocated = "hook_allocated_peak"
)

// CompareNearWindow is how far outside the steady state host samples
// still count for a run none of whose samples fell inside it.
const CompareNearWindow = 10 * time.Second

// GPUResponse answers GET /api/v1/gpus.
type GPUResponse struct {
	Series []GPUSeries `json:"series"`
	// Spread is each metric's distribution over the GPUs, for a run's
	// GPUs when they are more than MaxRankSeries (no host, GPU, rank or
	// per_gpu named); Series is then empty and Notice says so. Points carry the
	// bucket's time; Ranks is how many GPUs reported in it.
	Spread []SeriesSpread `json:"spread,omitempty"`
	Notice string         `json:"notice,omitempty"`
}

// GPUSeries is one metric of one GPU of one host.
type GPUSeries struct {
	Host   string      `json:"host"`
	GPU    int         `json:"gpu"`
	UUID   string      `json:"uuid"`
	Name   string      `json:"name"`
	RunID  string      `json:"run_id"` // run holding the GPU at the last sample
	Metric string      `json:"metric"` // util_pct, mem_used_bytes, power_w, temp_c, …
	Unit   string      `json:"unit"`
	Points []TimePoint `json:"points"`
}

// TimePoint is one (possibly aggregated) timed value.
type TimePoint struct {
	Time  time.Time `json:"time"`
	Value Float     `json:"value"`
	Min   Float     `json:"min"`
	Max   Float     `json:"max"`
}

// AnnotationsResponse answers GET /api/v1/annotations.
type AnnotationsResponse struct {
	Annotations []Annotation `json:"annotations"`
}

// Annotation is an event of a run, for Grafana annotations.
type Annotation struct {
	RunID string    `json:"run_id"`
	Time  time.Time `json:"time"`
	Step  *int64    `json:"step"`
	Type  string    `json:"type"` // checkpoint, overflow, restart, eval, note, …
	Title string    `json:"title"`
	Text  string    `json:"text"`
	Tags  []string  `json:"tags"`
	// Summary is, for a hang report, the sentence saying which rank
	// stopped first, where, and the last collective of each rank; the
	// report itself (every thread's stack) stays in Text.
	Summary string `json:"summary,omitempty"`
}
