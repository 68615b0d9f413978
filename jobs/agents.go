package jobs

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
)

func (h *Handler) listQuotas(ctx context.Context, c echo.Context) (int, any, error) {
	qs, err := h.store.Quotas(ctx)
	return http.StatusOK, api.QuotaList{Quotas: qs}, err
}

func (h *Handler) showQuota(ctx context.Context, c echo.Context) (int, any, error) {
	p := c.Param("project")
	if err := checkProject(p); err != nil {
		return 0, nil, err
	}
	if err := h.knownProject(ctx, p); err != nil {
		return 0, nil, err
	}
	q, err := h.store.Quota(ctx, p)
	return http.StatusOK, q, err
}

func (h *Handler) knownProject(ctx context.Context, p string) error {
	ok, err := h.store.ProjectKnown(ctx, p)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("unknown project %q: no run, job or agent has it yet: %w", p, store.ErrNotFound)
	}
	return nil
}

func (h *Handler) setQuota(ctx context.Context, c echo.Context) (int, any, error) {
	p := c.Param("project")
	if err := checkProject(p); err != nil {
		return 0, nil, err
	}
	var in api.QuotaSet
	if err := decode(c, &in); err != nil {
		return 0, nil, err
	}
	if in.GPUHours != nil && (math.IsNaN(*in.GPUHours) || *in.GPUHours < 0 || *in.GPUHours > 1e9) {
		return 0, nil, bad("gpu_hours", "%v: want 0 to 1e9 GPU-hours, or null to remove the quota", *in.GPUHours)
	}
	if err := h.knownProject(ctx, p); err != nil {
		return 0, nil, err
	}
	if err := h.store.SetQuota(ctx, p, in.GPUHours); err != nil {
		return 0, nil, err
	}
	h.mu.Lock()
	h.overAt = time.Time{} // the next claim reads the new limit
	h.mu.Unlock()
	q, err := h.store.Quota(ctx, p)
	return http.StatusOK, q, err
}

func (h *Handler) listAgents(ctx context.Context, c echo.Context) (int, any, error) {
	list, err := h.store.Agents(ctx, h.opt.HeartbeatTimeout)
	if list == nil {
		list = []api.Agent{}
	}
	return http.StatusOK, api.AgentList{Agents: list}, err
}

func agentName(c echo.Context) (string, error) {
	n := c.Param("name")
	if !namePattern.MatchString(n) {
		return "", bad("name", "%q is not an agent name: letters, digits, '.', '_' and '-', at most 128", n)
	}
	return n, nil
}

func checkGPUList(field string, gpus []int) error {
	if len(gpus) > 256 {
		return bad(field, "more than 256 GPUs")
	}
	for _, g := range gpus {
		if g < 0 || g > 1023 {
			return bad(field, "GPU %d: want indices from 0 to 1023", g)
		}
	}
	s := slices.Clone(gpus)
	slices.Sort(s)
	if len(slices.Compact(s)) != len(gpus) {
		return bad(field, "a GPU appears twice")
	}
	return nil
}

func checkProjects(ps []string) error {
	for _, p := range ps {
		if !namePattern.MatchString(p) {
			return bad("projects", "%q is not a project name", p)
		}
	}
	return nil
}

func (h *Handler) heartbeat(ctx context.Context, c echo.Context) (int, any, error) {
	name, err := agentName(c)
	if err != nil {
		return 0, nil, err
	}
	var in api.AgentHeartbeat
	if err := decode(c, &in); err != nil {
		return 0, nil, err
	}
	if err := checkGPUList("gpus", in.GPUs); err != nil {
		return 0, nil, err
	}
	if err := checkProjects(in.Projects); err != nil {
		return 0, nil, err
	}
	if len(in.Host) > 255 || len(in.Executor) > 32 || len(in.Version) > 64 || len(in.Running) > 1024 {
		return 0, nil, bad("body", "host, executor, version or running is too long")
	}
	r, err := h.store.Heartbeat(ctx, store.AgentBeat{Name: name, Host: in.Host, GPUs: in.GPUs, Executor: in.Executor,
		Projects: in.Projects, Running: in.Running, Version: in.Version}, h.opt.HeartbeatTimeout)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, api.AgentHeartbeatReply{Cancel: orNone(r.Cancel), Drop: orNone(r.Drop),
		HeartbeatSeconds: h.opt.HeartbeatTimeout.Seconds() / 3, TimeoutSeconds: h.opt.HeartbeatTimeout.Seconds()}, nil
}

func orNone(v []int64) []int64 {
	if v == nil {
		return []int64{}
	}
	return v
}

// overQuota returns the projects over quota, read at most once a second.
func (h *Handler) overQuota(ctx context.Context) ([]string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if time.Since(h.overAt) < time.Second {
		return h.over, nil
	}
	over, err := h.store.OverQuota(ctx)
	if err != nil {
		return nil, err
	}
	h.over, h.overAt = over, time.Now()
	return over, nil
}

func (h *Handler) claim(ctx context.Context, c echo.Context) (int, any, error) {
	name, err := agentName(c)
	if err != nil {
		return 0, nil, err
	}
	var in api.AgentClaim
	if err := decode(c, &in); err != nil {
		return 0, nil, err
	}
	if err := checkGPUList("free_gpus", in.FreeGPUs); err != nil {
		return 0, nil, err
	}
	if err := checkProjects(in.Projects); err != nil {
		return 0, nil, err
	}
	over, err := h.overQuota(ctx)
	if err != nil {
		return 0, nil, err
	}
	j, err := h.store.Claim(ctx, name, in.Executor, in.FreeGPUs, in.Projects, over)
	if err != nil || j == nil {
		return http.StatusOK, api.AgentClaimReply{}, err
	}
	h.log.Info("job claimed", "job", j.ID, "agent", name, "gpus", j.GPUIDs)
	return http.StatusOK, api.AgentClaimReply{Job: j, Env: JobEnv(*j)}, nil
}

// JobEnv is the environment the agent sets for a job besides its own:
// the ids the hook reads to link the run, the project, and the
// parameters (see ParamEnv).
func JobEnv(j api.Job) []string {
	env := []string{
		"DEEPSEED_JOB_ID=" + strconv.FormatInt(j.ID, 10),
		"DEEPSEED_RUN_ID=" + orString(j.RunID, "job-"+strconv.FormatInt(j.ID, 10)),
		"DEEPSEED_PROJECT=" + j.Project,
	}
	if j.SweepID != "" {
		env = append(env, "DEEPSEED_SWEEP_ID="+j.SweepID)
	}
	return append(env, ParamEnv(j.Params)...)
}

func (h *Handler) report(ctx context.Context, c echo.Context) (int, any, error) {
	name, err := agentName(c)
	if err != nil {
		return 0, nil, err
	}
	id, err := idParam(c)
	if err != nil {
		return 0, nil, err
	}
	var in api.JobReport
	if err := decode(c, &in); err != nil {
		return 0, nil, err
	}
	switch in.State {
	case store.JobQueued, store.JobRunning, store.JobFinished, store.JobFailed, store.JobCancelled, store.JobLost:
	default:
		return 0, nil, bad("state", "%q is not queued, running, finished, failed, cancelled or lost", in.State)
	}
	if len(in.OutputTail) > 64<<10 || len(in.ExternalID) > 128 || len(in.Detail) > 4096 {
		return 0, nil, bad("body", "output_tail is longer than 64 KiB, external_id than 128 bytes or detail than 4 KiB")
	}
	err = h.store.Report(ctx, name, id, in)
	if errors.Is(err, store.ErrNotFound) {
		return 0, nil, fmt.Errorf("job %d: %w", id, err)
	}
	if err != nil {
		return 0, nil, err
	}
	if in.State != store.JobRunning && in.State != store.JobQueued {
		h.log.Info("job ended", "job", id, "agent", name, "state", in.State, api.ExitCodeAttr(in.ExitCode))
	}
	j, err := h.store.Job(ctx, id)
	return http.StatusOK, j, err
}

// Reap marks lost, every quarter of the heartbeat timeout until ctx is
// cancelled, the running jobs whose agent has been silent for longer than
// the timeout. Several servers may reap at once: a job is marked once.
func (h *Handler) Reap(ctx context.Context) {
	every := min(max(h.opt.HeartbeatTimeout/4, 250*time.Millisecond), 15*time.Second)
	log := h.log.With("component", "jobs")
	for {
		if _, err := h.store.ReapLost(ctx, h.opt.HeartbeatTimeout); err != nil && ctx.Err() == nil {
			log.Error("marking silent jobs lost failed; retrying", "err", err, "next_in", every.String())
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}
