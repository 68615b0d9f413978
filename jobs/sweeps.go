package jobs

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"sort"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
)

func checkGoal(goal string) error {
	switch goal {
	case "", "min", "max":
		return nil
	}
	return bad("goal", "%q: want min or max", goal)
}

func checkMetric(m string) error {
	if len(m) > 128 || (m != "" && !paramName.MatchString(m)) {
		return bad("metric", "%q is not a metric name such as val_accuracy", m)
	}
	return nil
}

func (h *Handler) createSweep(ctx context.Context, c echo.Context) (int, any, error) {
	var in api.SweepCreate
	if err := decode(c, &in); err != nil {
		return 0, nil, err
	}
	if err := checkQueued(in.Project, in.Argv, &in.GPUs, in.Retries); err != nil {
		return 0, nil, err
	}
	if len(in.Params) == 0 {
		return 0, nil, bad("params", "a sweep needs at least one parameter, e.g. lr=1e-5,2e-5")
	}
	if in.Trials < 0 || in.Trials > MaxTrials {
		return 0, nil, bad("trials", "%d: want 1 to %d trials", in.Trials, MaxTrials)
	}
	if err := checkGoal(in.Goal); err != nil {
		return 0, nil, err
	}
	if err := checkMetric(in.Metric); err != nil {
		return 0, nil, err
	}
	if err := checkParams(in.Argv, in.Params, nil); err != nil {
		return 0, nil, err
	}
	var seed uint64
	if in.Seed != nil {
		seed = uint64(*in.Seed)
	} else {
		var b [8]byte
		_, _ = rand.Read(b[:])
		seed = binary.LittleEndian.Uint64(b[:])
	}
	sets, err := Expand(in.Params, in.Trials, seed)
	if err != nil {
		return 0, nil, err
	}
	if err := h.checkGPUs(ctx, in.Project, in.GPUs); err != nil {
		return 0, nil, err
	}
	sw := store.NewSweep{ID: newSweepID(), Project: in.Project, Argv: in.Argv, Spec: in.Params, Trials: len(sets),
		GPUs: in.GPUs, Metric: in.Metric, Goal: in.Goal}
	jobs := make([]store.NewJob, len(sets))
	for i, p := range sets {
		jobs[i] = store.NewJob{Project: in.Project, SweepID: sw.ID, Argv: substitute(in.Argv, p), Params: p,
			GPUs: in.GPUs, Retries: in.Retries}
	}
	if err := h.store.CreateSweep(ctx, sw, jobs, quotaCheck(in.Project)); err != nil {
		return 0, nil, err
	}
	h.log.Info("sweep queued", "sweep", sw.ID, "project", in.Project, "trials", len(sets))
	out, err := h.sweep(ctx, sw.ID, in.Metric, in.Goal)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, out, nil
}

func (h *Handler) listSweeps(ctx context.Context, c echo.Context) (int, any, error) {
	project := c.QueryParam("project")
	if project != "" {
		if err := checkProject(project); err != nil {
			return 0, nil, err
		}
	}
	limit, err := limitParam(c)
	if err != nil {
		return 0, nil, err
	}
	list, err := h.store.Sweeps(ctx, project, limit)
	if list == nil {
		list = []api.SweepSummary{}
	}
	return http.StatusOK, api.SweepList{Sweeps: list, Limit: limit}, err
}

func (h *Handler) showSweep(ctx context.Context, c echo.Context) (int, any, error) {
	id := c.Param("id")
	if len(id) > api.MaxIDLen {
		return 0, nil, bad("id", "longer than %d bytes", api.MaxIDLen)
	}
	metric, goal := c.QueryParam("metric"), c.QueryParam("goal")
	if err := checkMetric(metric); err != nil {
		return 0, nil, err
	}
	if err := checkGoal(goal); err != nil {
		return 0, nil, err
	}
	out, err := h.sweep(ctx, id, metric, goal)
	if errors.Is(err, store.ErrNotFound) {
		return 0, nil, fmt.Errorf("sweep %s: %w", id, err)
	}
	return http.StatusOK, out, err
}

// sweep reads a sweep and its trials, ranked by metric (the sweep's own
// when none is given) toward goal (max when none is known).
func (h *Handler) sweep(ctx context.Context, id, metric, goal string) (api.Sweep, error) {
	sw, err := h.store.GetSweep(ctx, id)
	if err != nil {
		return sw, err
	}
	if metric == "" {
		metric, goal = sw.Metric, orString(goal, sw.Goal)
	}
	if goal == "" {
		goal = "max"
		if len(metric) >= 4 && metric[len(metric)-4:] == "loss" {
			goal = "min"
		}
	}
	sw.Metric, sw.Goal = metric, goal
	list, counts, err := h.store.Jobs(ctx, store.JobFilter{SweepID: id, Limit: MaxTrials * 11})
	if err != nil {
		return sw, err
	}
	sw.Counts = counts
	sort.Slice(list, func(i, j int) bool { return list[i].ID < list[j].ID })
	sw.Trials = make([]api.Trial, len(list))
	var runs []string
	for i, j := range list {
		sw.Trials[i].Job = j
		if j.RunID != "" {
			runs = append(runs, j.RunID)
		}
	}
	if metric == "" || len(runs) == 0 {
		return sw, nil
	}
	vals, err := h.store.RunMetrics(ctx, runs, metric)
	if err != nil {
		return sw, err
	}
	for i := range sw.Trials {
		v, ok := vals[sw.Trials[i].Job.RunID]
		if !ok {
			continue
		}
		best := v.Max
		if goal == "min" {
			best = v.Min
		}
		final := v.Final
		sw.Trials[i].Final, sw.Trials[i].Best = &final, &best
	}
	better := func(a, b float64) bool { return a > b }
	if goal == "min" {
		better = func(a, b float64) bool { return a < b }
	}
	sort.SliceStable(sw.Trials, func(i, j int) bool {
		a, b := sw.Trials[i].Best, sw.Trials[j].Best
		switch {
		case a == nil || b == nil:
			return a != nil
		case *a != *b:
			return better(*a, *b)
		}
		return false
	})
	for i := range sw.Trials {
		if sw.Trials[i].Best != nil {
			sw.Trials[i].Rank = i + 1
		}
	}
	return sw, nil
}

func orString(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
