package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/deepseed/deepseed/api"
)

// ExecutorConfig is what an executor's constructor is given.
type ExecutorConfig struct {
	// StateDir is the agent's own directory (output files go under it).
	StateDir string
	Log      *slog.Logger
	// Job says as whom jobs run and what they are given (every executor).
	Job JobConfig
	// Slurm holds the Slurm executor's settings (--executor slurm); its
	// OutputDir defaults to <state-dir>/slurm.
	Slurm SlurmConfig
}

// Executors maps the --executor names to their constructors. An executor
// plugs in with one entry here (or one assignment in its file's init).
var Executors = map[string]func(ExecutorConfig) (Executor, error){
	"local": func(c ExecutorConfig) (Executor, error) { return NewLocal(c.StateDir, c.Job) },
	"slurm": func(c ExecutorConfig) (Executor, error) {
		sc := c.Slurm
		if sc.OutputDir == "" {
			sc.OutputDir = filepath.Join(c.StateDir, "slurm")
		}
		if sc.Logger == nil {
			sc.Logger = c.Log
		}
		sc.Job = c.Job
		return NewSlurm(sc)
	},
}

// ExecutorNames lists the executors, sorted.
func ExecutorNames() []string {
	var out []string
	for n := range Executors {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Config is what an agent needs.
type Config struct {
	Server   string // the server's base URL
	Token    string // a token with agent scope
	Name     string // the agent's name; the host name when empty
	GPUs     []int  // the GPUs it may hand out
	Projects []string
	Executor Executor
	StateDir string        // holds state.json
	Every    time.Duration // how often it claims and polls; 0 means 2s
	Grace    time.Duration // SIGTERM to SIGKILL on cancel; 0 means 10s
	Version  string
	HTTP     *http.Client
	Log      *slog.Logger
}

// Agent claims jobs from the server and runs them through its executor.
type Agent struct {
	cfg    Config
	c      *client
	state  stateFile
	log    *slog.Logger
	beat   time.Duration
	mu     sync.Mutex
	held   map[int64]*heldJob
	busyWG sync.WaitGroup
}

// New checks cfg and returns an agent.
func New(cfg Config) (*Agent, error) {
	if cfg.Server == "" {
		return nil, errors.New("agent: no server URL")
	}
	if cfg.Executor == nil {
		return nil, errors.New("agent: no executor")
	}
	if len(cfg.GPUs) == 0 {
		return nil, errors.New("agent: no GPUs to hand out")
	}
	if cfg.Name == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("agent: name: %w", err)
		}
		cfg.Name = h
	}
	if cfg.Every <= 0 {
		cfg.Every = 2 * time.Second
	}
	if cfg.Grace <= 0 {
		cfg.Grace = 10 * time.Second
	}
	if cfg.HTTP == nil {
		cfg.HTTP = &http.Client{}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("agent: state dir: %w", err)
	}
	return &Agent{
		cfg:   cfg,
		c:     &client{base: strings.TrimRight(cfg.Server, "/"), token: cfg.Token, name: cfg.Name, http: cfg.HTTP},
		state: stateFile{path: filepath.Join(cfg.StateDir, "state.json")},
		log:   cfg.Log.With("agent", cfg.Name),
		beat:  5 * time.Second,
		held:  map[int64]*heldJob{},
	}, nil
}

// Run re-adopts the jobs of the state file, then claims, polls,
// heartbeats and forwards cancels until ctx is cancelled. Running jobs
// are left running when it returns: a restarted agent re-adopts them.
func (a *Agent) Run(ctx context.Context) error {
	doc, err := a.state.load()
	if err != nil {
		return err
	}
	for _, j := range doc.Jobs {
		if j.Starting {
			a.find(ctx, j)
		}
		a.held[j.ID] = j
		a.log.Info("re-adopting job from the state file", "job", j.ID, "external_id", j.Handle.ExternalID)
	}
	if len(doc.Jobs) > 0 {
		a.save()
	}
	a.poll(ctx) // reports what ended while the agent was down
	lastBeat := time.Time{}
	tick := time.NewTicker(a.cfg.Every)
	defer tick.Stop()
	defer a.busyWG.Wait()
	for {
		if time.Since(lastBeat) >= a.beat {
			err := a.heartbeat(ctx)
			var se *StatusError
			if lastBeat.IsZero() && errors.As(err, &se) && (se.Code == http.StatusUnauthorized || se.Code == http.StatusForbidden) {
				// A token the server refuses from the start will not
				// mend itself: say so rather than retry for ever. Jobs
				// already running keep running; a restart re-adopts them.
				return fmt.Errorf("agent %s: the server refused its token (%s): set DEEPSEED_AGENT_TOKEN or --token-file to a token that the server's DEEPSEED_AGENT_TOKENS binds to this name (NAME:TOKEN)", a.cfg.Name, se.Msg)
			}
			if err != nil && ctx.Err() == nil {
				a.log.Warn("heartbeat failed; retrying", "err", err)
			} else {
				lastBeat = time.Now()
			}
		}
		a.poll(ctx)
		a.claim(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// find looks for a job the agent was starting when it stopped. One its
// executor cannot find is reported lost: whether it ran is unknown.
func (a *Agent) find(ctx context.Context, j *heldJob) {
	j.Starting = false
	if f, ok := a.cfg.Executor.(Finder); ok {
		h, found, err := f.Find(ctx, strconv.FormatInt(j.ID, 10))
		if err == nil && found {
			j.Handle = h
			a.log.Info("found the job this agent was starting when it stopped", "job", j.ID, "external_id", h.ExternalID)
			return
		}
		if err != nil {
			a.log.Warn("could not look for the job this agent was starting when it stopped", "job", j.ID, "err", err)
		}
	}
	j.first = &Status{State: StateLost, Detail: "the agent stopped while starting it and found no trace of it since: whether it ran is unknown"}
}

func (a *Agent) save() {
	a.mu.Lock()
	doc := stateDoc{Agent: a.cfg.Name}
	for _, j := range a.held {
		c := *j
		doc.Jobs = append(doc.Jobs, &c)
	}
	a.mu.Unlock()
	sort.Slice(doc.Jobs, func(i, k int) bool { return doc.Jobs[i].ID < doc.Jobs[k].ID })
	if err := a.state.save(doc); err != nil {
		a.log.Error("could not save the agent state; a restart may not re-adopt jobs", "err", err)
	}
}

func (a *Agent) running() []int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	ids := make([]int64, 0, len(a.held))
	for id := range a.held {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func (a *Agent) freeGPUs() []int {
	a.mu.Lock()
	defer a.mu.Unlock()
	used := map[int]bool{}
	for _, j := range a.held {
		for _, g := range j.GPUIDs {
			used[g] = true
		}
	}
	var free []int
	for _, g := range a.cfg.GPUs {
		if !used[g] {
			free = append(free, g)
		}
	}
	return free
}

func (a *Agent) heartbeat(ctx context.Context) error {
	host, _ := os.Hostname()
	r, err := a.c.heartbeat(ctx, api.AgentHeartbeat{Host: host, GPUs: a.cfg.GPUs, Executor: a.cfg.Executor.Name(),
		Projects: a.cfg.Projects, Running: a.running(), Version: a.cfg.Version})
	if err != nil {
		return err
	}
	if r.HeartbeatSeconds > 0 {
		a.beat = time.Duration(r.HeartbeatSeconds * float64(time.Second))
	}
	for _, id := range r.Cancel {
		a.cancel(ctx, id, false)
	}
	for _, id := range r.Drop {
		a.log.Warn("the server no longer counts this job as ours (it was lost while we were silent): stopping it", "job", id)
		a.cancel(ctx, id, true)
	}
	return nil
}

// cancel forwards a cancel to the executor, once per job, in the
// background (it may wait out the grace period). drop forgets the job
// afterwards without reporting it.
func (a *Agent) cancel(ctx context.Context, id int64, drop bool) {
	a.mu.Lock()
	j := a.held[id]
	if j == nil || j.dropping || (j.Cancelling && !drop) {
		a.mu.Unlock()
		return
	}
	j.Cancelling, j.dropping = true, drop
	h := j.Handle
	a.mu.Unlock()
	a.save()
	a.log.Info("cancelling job", "job", id, "external_id", h.ExternalID, "grace", a.cfg.Grace.String())
	a.busyWG.Add(1)
	go func() {
		defer a.busyWG.Done()
		if err := a.cfg.Executor.Cancel(context.WithoutCancel(ctx), h, a.cfg.Grace); err != nil {
			a.log.Error("cancel failed", "job", id, "err", err)
		}
		if drop {
			a.mu.Lock()
			delete(a.held, id)
			a.mu.Unlock()
			a.save()
		}
	}()
}

// poll asks the executor about every held job and reports changes; an
// ended job's GPUs are free once the server has its final state.
func (a *Agent) poll(ctx context.Context) {
	for _, id := range a.running() {
		a.mu.Lock()
		j := a.held[id]
		a.mu.Unlock()
		if j == nil {
			continue
		}
		var st Status
		var err error
		// An ended answer kept from the start is reported until the
		// server has it; the job then leaves a.held.
		a.mu.Lock()
		first := j.first
		a.mu.Unlock()
		if first != nil {
			st = *first
		} else {
			st, err = a.cfg.Executor.Poll(ctx, j.Handle)
		}
		if err != nil {
			a.log.Warn("poll failed", "job", id, "err", err)
			continue
		}
		a.mu.Lock()
		if j.Cancelling && st.Ended() && st.State != StateLost {
			// Stopped by a cancel this agent forwarded before a restart
			// made the executor forget it: whatever status the command
			// chose, it was cancelled.
			st.State, st.Detail = StateCancelled, ""
		}
		a.mu.Unlock()
		rep := api.JobReport{State: st.State, ExitCode: st.ExitCode, ExternalID: j.Handle.ExternalID,
			OutputTail: st.OutputTail, Detail: st.Detail}
		if st.Ended() && !st.EndedAt.IsZero() {
			rep.EndedAt = &st.EndedAt
		}
		// A running job's output tail goes with a report every 10 s at
		// most, when it has changed.
		if !st.Ended() && st.State == j.Reported && (st.OutputTail == j.tail || time.Since(j.tailAt) < 10*time.Second) {
			continue
		}
		err = a.c.report(ctx, id, rep)
		var se *StatusError
		switch {
		case errors.As(err, &se) && (se.Code == http.StatusConflict || se.Code == http.StatusNotFound):
			// The server has ended it already (lost while we were away,
			// perhaps retried elsewhere): it is no longer ours. One still
			// running is stopped.
			a.log.Warn("the server refused our report; the job is no longer ours", "job", id, "state", st.State, "answer", se.Msg)
			if !st.Ended() {
				a.cancel(ctx, id, true)
				continue
			}
		case err != nil:
			a.log.Warn("report failed; retrying", "job", id, "state", st.State, "err", err)
			continue
		}
		j.tail, j.tailAt = st.OutputTail, time.Now()
		if st.Ended() {
			a.log.Info("job ended", "job", id, "state", st.State, api.ExitCodeAttr(st.ExitCode))
			a.mu.Lock()
			delete(a.held, id)
			a.mu.Unlock()
		} else {
			a.mu.Lock()
			j.Reported = st.State
			a.mu.Unlock()
		}
		a.save()
	}
}

// claim takes jobs while GPUs are free and the server has jobs for them.
func (a *Agent) claim(ctx context.Context) {
	for ctx.Err() == nil {
		free := a.freeGPUs()
		if len(free) == 0 {
			return
		}
		r, err := a.c.claim(ctx, api.AgentClaim{FreeGPUs: free, Projects: a.cfg.Projects, Executor: a.cfg.Executor.Name()})
		if err != nil {
			if ctx.Err() == nil {
				a.log.Warn("claim failed; retrying", "err", err)
			}
			return
		}
		if r.Job == nil {
			return
		}
		a.start(ctx, *r.Job, r.Env)
	}
}

func (a *Agent) start(ctx context.Context, j api.Job, env []string) {
	spec := Spec{JobID: strconv.FormatInt(j.ID, 10), Name: j.Project + "-" + strconv.FormatInt(j.ID, 10), Project: j.Project,
		Argv: j.Argv, Env: env, GPUs: j.GPUs, GPUIDs: j.GPUIDs}
	log := a.log.With("job", j.ID)
	// The job is on disk before it starts, so that an agent killed
	// before it records the handle looks for the job after its restart.
	held := &heldJob{ID: j.ID, GPUIDs: j.GPUIDs, Handle: Handle{Executor: a.cfg.Executor.Name()}, Starting: true}
	a.mu.Lock()
	a.held[j.ID] = held
	a.mu.Unlock()
	a.save()
	h, err := a.cfg.Executor.Start(ctx, spec)
	if err != nil {
		a.mu.Lock()
		delete(a.held, j.ID)
		a.mu.Unlock()
		a.save()
		log.Warn("job did not start", "err", err)
		if rerr := a.c.report(ctx, j.ID, api.JobReport{State: StateFailed, Detail: err.Error()}); rerr != nil {
			log.Error("could not report the failed start", "err", rerr)
		}
		return
	}
	a.mu.Lock()
	held.Handle, held.Starting = h, false
	a.mu.Unlock()
	a.save()
	log.Info("job started", "argv", j.Argv, "gpus", j.GPUIDs, "external_id", h.ExternalID)
	// The first report says what the executor says: a local process runs at
	// once, a Slurm job may wait in its queue (pending), and its runtime —
	// what quotas count — begins only when it runs. An ended or unknown
	// state is left to the next poll.
	// Executors may hand out a final state once (the local one forgets a
	// child it has reaped), so an ended answer is kept for the next poll.
	state := StateRunning
	if st, err := a.cfg.Executor.Poll(ctx, h); err == nil {
		switch {
		case st.State == StateQueued:
			state = StateQueued
		case st.Ended():
			held.first = &st
		}
	}
	if err := a.c.report(ctx, j.ID, api.JobReport{State: state, ExternalID: h.ExternalID}); err == nil {
		a.mu.Lock()
		held.Reported = state
		a.mu.Unlock()
		a.save()
	}
}
