// Package agent runs DeepSeed jobs on a GPU node: it claims queued jobs from
// the server, starts each through an Executor (a local process, or a Slurm
// batch job), reports state, heartbeats and output, and forwards cancels.
package agent

import (
	"context"
	"time"
)

// Job states as the server and the agent speak of them.
const (
	StateQueued    = "queued"
	StateRunning   = "running"
	StateFinished  = "finished"
	StateFailed    = "failed"
	StateCancelled = "cancelled"
	StateLost      = "lost"
)

// Spec is what an executor needs to start one job.
type Spec struct {
	JobID   string   // the server's job id
	Name    string   // a short human name (project and job id), for schedulers that show one
	Project string   // the job's project
	Argv    []string // the command, never run through a shell
	Env     []string // extra KEY=VALUE pairs: DEEPSEED_RUN_ID, DEEPSEED_JOB_ID, DEEPSEED_SWEEP_ID, parameters
	Dir     string   // working directory; empty means one of the job's own, under the agent's state dir
	GPUs    int      // how many GPUs the job asked for
	GPUIDs  []int    // the GPUs the agent holds for it (local executor: CUDA_VISIBLE_DEVICES)
}

// Handle names a started job inside its executor: a process id (with its
// start time, so a reused pid is not mistaken for the job) or a Slurm job id.
// It is JSON so the agent can keep it on disk and re-adopt the job after a
// restart.
type Handle struct {
	Executor   string    `json:"executor"`              // "local" or "slurm"
	ExternalID string    `json:"external_id"`           // pid or Slurm job id, as text
	StartedAt  time.Time `json:"started_at"`            // when the executor started it
	OutputPath string    `json:"output_path,omitempty"` // where its stdout and stderr go
	ExitPath   string    `json:"exit_path,omitempty"`   // local: where its wrapper writes the exit status
}

// Status is what an executor knows of a job now.
type Status struct {
	State      string // one of the State constants; queued means "accepted, not yet running" (Slurm PENDING)
	ExitCode   *int   // set once the job has ended with an exit status
	OutputTail string // the last bytes of stdout and stderr together, bounded by the executor
	Detail     string // why, in words, when the state needs one (for example "slurm: NODE_FAIL")
	// EndedAt is when the job ended, once it has, where the executor knows
	// (zero otherwise: the report's time stands for it).
	EndedAt time.Time
}

// Ended reports whether the state is final.
func (s Status) Ended() bool {
	switch s.State {
	case StateFinished, StateFailed, StateCancelled, StateLost:
		return true
	}
	return false
}

// Finder is implemented by executors that can find a job they started from
// its id alone. An agent killed between starting a job and recording its
// handle asks Find after its restart, rather than calling the job lost;
// found is false when the executor knows nothing of it.
type Finder interface {
	Find(ctx context.Context, jobID string) (h Handle, found bool, err error)
}

// Executor starts, follows and stops jobs. Implementations must be safe for
// use by one goroutine per job.
type Executor interface {
	// Name is "local" or "slurm".
	Name() string
	// Start launches the job and returns its handle once the executor has
	// accepted it (a process started, or sbatch answered with a job id).
	Start(ctx context.Context, spec Spec) (Handle, error)
	// Poll reports the job's state; after a restart of the agent it also
	// re-adopts a job from its handle, answering StateLost when the job can
	// no longer be found.
	Poll(ctx context.Context, h Handle) (Status, error)
	// Cancel asks the job to stop (SIGTERM, or scancel), and kills it after
	// grace if it is still running (SIGKILL, or scancel --signal=KILL).
	Cancel(ctx context.Context, h Handle, grace time.Duration) error
}
