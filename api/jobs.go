package api

import (
	"log/slog"
	"time"
)

// Job is one attempt of a command run by an agent: GET /api/v1/jobs/{id}
// and the items of GET /api/v1/jobs.
type Job struct {
	ID              int64             `json:"id"`
	Project         string            `json:"project"`
	SweepID         string            `json:"sweep_id,omitempty"`
	State           string            `json:"state"` // queued, running, finished, failed, cancelled, lost
	Argv            []string          `json:"argv"`
	Params          map[string]string `json:"params,omitempty"`
	GPUs            int               `json:"gpus"`              // asked for
	GPUIDs          []int             `json:"gpu_ids,omitempty"` // held, on the agent's node
	Agent           string            `json:"agent,omitempty"`
	Executor        string            `json:"executor,omitempty"`
	ExternalID      string            `json:"external_id,omitempty"` // pid or Slurm job id
	ExitCode        *int              `json:"exit_code,omitempty"`
	OutputTail      string            `json:"output_tail,omitempty"`
	Detail          string            `json:"detail,omitempty"`
	RunID           string            `json:"run_id,omitempty"` // the run it started, once it has sent one
	Retries         int               `json:"retries"`          // retries left after this attempt is lost
	Attempt         int               `json:"attempt"`
	RetryOf         *int64            `json:"retry_of,omitempty"`
	CancelRequested bool              `json:"cancel_requested,omitempty"`
	CreatedAt       time.Time         `json:"created_at"`
	StartedAt       *time.Time        `json:"started_at,omitempty"`
	EndedAt         *time.Time        `json:"ended_at,omitempty"`
	HeartbeatAt     *time.Time        `json:"heartbeat_at,omitempty"`
	RuntimeSeconds  float64           `json:"runtime_seconds"`
	GPUHours        float64           `json:"gpu_hours"`
}

// JobSubmit is the body of POST /api/v1/jobs.
type JobSubmit struct {
	Project string            `json:"project"`
	Argv    []string          `json:"argv"`
	GPUs    int               `json:"gpus"` // 0 means 1
	Retries int               `json:"retries,omitempty"`
	Params  map[string]string `json:"params,omitempty"` // substituted into {name} and given as env vars
}

// JobList answers GET /api/v1/jobs: jobs newest first and the counters of
// every job that matches the filter.
type JobList struct {
	Jobs   []Job     `json:"jobs"`
	Counts JobCounts `json:"counts"`
	Limit  int       `json:"limit"`
}

// JobCounts counts jobs by state: active is queued plus running, done is
// finished, failed is failed plus lost.
type JobCounts struct {
	Total     int `json:"total"`
	Queued    int `json:"queued"`
	Running   int `json:"running"`
	Active    int `json:"active"`
	Done      int `json:"done"`
	Failed    int `json:"failed"`
	Cancelled int `json:"cancelled"`
	Lost      int `json:"lost"`
}

// SweepCreate is the body of POST /api/v1/sweeps. Each parameter is
// either comma-separated values ("1e-5,2e-5": swept; one value: fixed) or,
// with Trials set, a range "min:max" (uniform) or "log:min:max"
// (log-uniform) sampled once per trial; "int:min:max" draws integers.
type SweepCreate struct {
	Project string            `json:"project"`
	Argv    []string          `json:"argv"`
	Params  map[string]string `json:"params"`
	GPUs    int               `json:"gpus"`
	Retries int               `json:"retries,omitempty"`
	Trials  int               `json:"trials,omitempty"` // random search: this many trials
	Seed    *int64            `json:"seed,omitempty"`   // random search seed; none picks one
	Metric  string            `json:"metric,omitempty"` // the default ranking metric of sweep show
	Goal    string            `json:"goal,omitempty"`   // min or max
}

// SweepSummary is a sweep and the counters of its jobs: the items of GET
// /api/v1/sweeps.
type SweepSummary struct {
	ID        string            `json:"id"`
	Project   string            `json:"project"`
	Argv      []string          `json:"argv"`
	Params    map[string]string `json:"params"`
	GPUs      int               `json:"gpus"`
	Metric    string            `json:"metric,omitempty"`
	Goal      string            `json:"goal,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
	Counts    JobCounts         `json:"counts"`
}

// SweepList answers GET /api/v1/sweeps: sweeps newest first.
type SweepList struct {
	Sweeps []SweepSummary `json:"sweeps"`
	Limit  int            `json:"limit"`
}

// Sweep answers POST /api/v1/sweeps and GET /api/v1/sweeps/{id}: the
// sweep and its trials, ranked by Metric (best first, trials without a
// value last) when one is chosen.
type Sweep struct {
	SweepSummary
	Trials []Trial `json:"trials"`
}

// Trial is one job of a sweep beside its eval metric.
type Trial struct {
	Job   Job      `json:"job"`
	Final *float64 `json:"final,omitempty"` // the metric's last value
	Best  *float64 `json:"best,omitempty"`  // its best value by Goal
	Rank  int      `json:"rank,omitempty"`  // 1 is best; 0 without a value
}

// Quota is a project's GPU-hour limit and usage: PUT and GET
// /api/v1/quotas/{project}, items of GET /api/v1/quotas.
type Quota struct {
	Project      string   `json:"project"`
	GPUHours     *float64 `json:"gpu_hours"`      // the limit; null when none is set
	UsedGPUHours float64  `json:"used_gpu_hours"` // what the limit is held to: the jobs' GPU-hours
	JobGPUHours  float64  `json:"job_gpu_hours"`  // of jobs: runtime × GPUs held, from the executor's start and end
	RunGPUHours  float64  `json:"run_gpu_hours"`  // of runs no job started, from telemetry within the run's lifetime; not counted
	Exceeded     bool     `json:"exceeded"`
}

// QuotaSet is the body of PUT /api/v1/quotas/{project}.
type QuotaSet struct {
	GPUHours *float64 `json:"gpu_hours"`
}

// QuotaList answers GET /api/v1/quotas.
type QuotaList struct {
	Quotas []Quota `json:"quotas"`
}

// AgentHeartbeat is the body of POST /api/v1/agents/{name}/heartbeat.
type AgentHeartbeat struct {
	Host     string   `json:"host"`
	GPUs     []int    `json:"gpus"`
	Executor string   `json:"executor"`
	Projects []string `json:"projects,omitempty"` // none: every project
	Running  []int64  `json:"running"`            // the jobs it runs now
	Version  string   `json:"version,omitempty"`
}

// AgentHeartbeatReply tells the agent which of its jobs to cancel and
// which the server no longer counts as its own (lost while it was away:
// stop them).
type AgentHeartbeatReply struct {
	Cancel           []int64 `json:"cancel"`
	Drop             []int64 `json:"drop"`
	HeartbeatSeconds float64 `json:"heartbeat_seconds"` // how often to beat
	TimeoutSeconds   float64 `json:"timeout_seconds"`   // silence after which its jobs are lost
}

// AgentClaim is the body of POST /api/v1/agents/{name}/claim: the GPUs it
// has free now.
type AgentClaim struct {
	FreeGPUs []int    `json:"free_gpus"`
	Projects []string `json:"projects,omitempty"`
	Executor string   `json:"executor"`
}

// AgentClaimReply carries the claimed job, or none.
type AgentClaimReply struct {
	Job *Job     `json:"job"`
	Env []string `json:"env,omitempty"` // KEY=VALUE to set for it
}

// JobReport is the body of POST /api/v1/agents/{name}/jobs/{id}: what
// the agent's executor knows of a job it holds.
type JobReport struct {
	State      string `json:"state"`
	ExitCode   *int   `json:"exit_code,omitempty"`
	ExternalID string `json:"external_id,omitempty"`
	OutputTail string `json:"output_tail,omitempty"`
	Detail     string `json:"detail,omitempty"`
	// EndedAt is, with a final state, when the executor saw the job end,
	// if before the report (it ended while the agent was away): the job's
	// runtime, which quotas count, ends then. The server keeps it between
	// the job's start and now.
	EndedAt *time.Time `json:"ended_at,omitempty"`
}

// ExitCodeAttr is the log attribute of an exit code: the number, or
// "none" when there is none (the job was killed by a signal, or is lost).
func ExitCodeAttr(code *int) slog.Attr {
	if code == nil {
		return slog.String("exit_code", "none")
	}
	return slog.Int("exit_code", *code)
}

// Agent is one agent as GET /api/v1/agents lists it.
type Agent struct {
	Name          string    `json:"name"`
	Host          string    `json:"host"`
	GPUs          []int     `json:"gpus"`
	Executor      string    `json:"executor"`
	Projects      []string  `json:"projects"`
	Version       string    `json:"version,omitempty"`
	LastHeartbeat time.Time `json:"last_heartbeat"`
	Alive         bool      `json:"alive"`
	Running       int       `json:"running"`
}

// AgentList answers GET /api/v1/agents.
type AgentList struct {
	Agents []Agent `json:"agents"`
}
