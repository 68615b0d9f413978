package query

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/detect"
	"github.com/deepseed/deepseed/store"
)

// regressionCandidates bounds the project's runs a regression looks
// among for comparable ones: the newest, whatever the project holds.
const regressionCandidates = 200

// BaselineTag is the run tag that pins a project's baseline runs: when
// comparable runs carry it, they are the baseline.
const BaselineTag = "baseline"

// regression answers GET /runs/{id}/regression (docs/regression.md).
// baseline= pins baseline runs by id (at most api.RegressionMaxBaseline),
// baseline_tag= the comparable runs carrying a tag (default: "baseline"
// when any comparable run carries it, else the newest comparable runs).
func (h *Handler) regression(ctx context.Context, c echo.Context) (any, error) {
	r, err := h.run(ctx, c)
	if err != nil {
		return nil, err
	}
	pinned := multiParam(c, "baseline")
	if len(pinned) > api.RegressionMaxBaseline {
		return nil, bad("baseline", "at most %d runs", api.RegressionMaxBaseline)
	}
	tag := c.QueryParam("baseline_tag")
	if len(tag) > 256 {
		return nil, bad("baseline_tag", "at most 256 bytes")
	}
	var base []*store.RunRow
	for _, id := range pinned {
		if id == r.RunID {
			return nil, bad("baseline", "the run itself cannot be its baseline")
		}
		b, err := h.store.GetRun(ctx, id)
		if errors.Is(err, store.ErrNotFound) {
			return nil, bad("baseline", "no run %q", id)
		}
		if err != nil {
			return nil, err
		}
		base = append(base, b)
	}
	pc := profileCache{}
	out, err := h.compareWithBaseline(ctx, r, base, tag, h.alertsConfig().WithMeta(r.Meta), pc)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// profileCache keeps the profiles one request computed, by run.
type profileCache map[string]*runProfile

type runProfile struct {
	p        detect.RunProfile
	from, to time.Time
	ok       bool // the run has steady steps
}

// Regression compares a run with its baseline as GET
// /runs/{id}/regression does with no parameter; the alert evaluator
// calls it (nil when the run has no comparable run or no steady steps).
func (h *Handler) Regression(ctx context.Context, runID string, cfg detect.Config) (*api.Regression, error) {
	r, err := h.store.GetRun(ctx, runID)
	if err != nil {
		return nil, err
	}
	out, err := h.compareWithBaseline(ctx, r, nil, "", cfg, profileCache{})
	if err != nil || len(out.Baseline) == 0 {
		return nil, err
	}
	return out, nil
}

// compareWithBaseline picks the baseline (pinned runs, else tagged
// comparable runs, else the newest comparable runs started before the
// run) and compares the run with it.
func (h *Handler) compareWithBaseline(ctx context.Context, r *store.RunRow, pinned []*store.RunRow, tag string,
	cfg detect.Config, pc profileCache) (*api.Regression, error) {
	out := &api.Regression{RunID: r.RunID, Fingerprint: fingerprintOf(r), Basis: "run", Baseline: []string{}}
	base := pinned
	if len(base) == 0 {
		var err error
		if base, out.Basis, err = h.comparableRuns(ctx, r, out.Fingerprint, tag); err != nil {
			return nil, err
		}
	}
	me, err := h.profileOf(ctx, r, pc)
	if err != nil {
		return nil, err
	}
	var profiles []detect.RunProfile
	for _, b := range base {
		p, err := h.profileOf(ctx, b, pc)
		if err != nil {
			return nil, err
		}
		if p.ok {
			profiles = append(profiles, p.p)
			out.Baseline = append(out.Baseline, b.RunID)
		}
	}
	switch {
	case !me.ok:
		detect.CompareRuns(cfg, detect.RunProfile{}, nil, out)
		out.Sentence, out.Note = "No regression computed: the run has no steady steps yet.", "no steady steps"
	case len(profiles) == 0:
		detect.CompareRuns(cfg, me.p, nil, out)
		out.Sentence = "No regression computed: no comparable run of the project (same model, parameters, world size, precision, parallelism and micro batch)."
		out.Note = "no baseline"
	default:
		detect.CompareRuns(cfg, me.p, profiles, out)
	}
	if len(pinned) > 0 {
		for _, b := range pinned {
			if !sameFingerprint(fingerprintOf(b), out.Fingerprint) {
				out.Note = fmt.Sprintf("baseline run %q has another fingerprint", b.RunID)
			}
		}
	}
	return out, nil
}

// comparableRuns returns the baseline runs of r: among the project's
// regressionCandidates newest runs, those of the same fingerprint
// started before r; those carrying tag (or BaselineTag when tag is empty
// and any carries it) when any does; at most api.RegressionMaxBaseline,
// the newest first.
func (h *Handler) comparableRuns(ctx context.Context, r *store.RunRow, fp api.Fingerprint, tag string) ([]*store.RunRow, string, error) {
	runs, _, err := h.store.ListRuns(ctx, store.RunFilter{Project: r.Project, Limit: regressionCandidates})
	if err != nil {
		return nil, "", err
	}
	var same, tagged []*store.RunRow
	want := tag
	if want == "" {
		want = BaselineTag
	}
	for _, o := range runs {
		if o.RunID == r.RunID || !sameFingerprint(fingerprintOf(o), fp) {
			continue
		}
		if r.StartedAt != nil && o.StartedAt != nil && !o.StartedAt.Before(*r.StartedAt) && !slices.Contains(o.Tags, want) {
			continue
		}
		same = append(same, o)
		if slices.Contains(o.Tags, want) {
			tagged = append(tagged, o)
		}
	}
	basis := "fingerprint"
	if len(tagged) > 0 || tag != "" {
		same, basis = tagged, "tag"
	}
	if len(same) > api.RegressionMaxBaseline {
		same = same[:api.RegressionMaxBaseline]
	}
	return same, basis, nil
}

// fingerprintOf is what makes runs comparable (api.Fingerprint); the
// precision and parallelism default as the compare table's do.
func fingerprintOf(r *store.RunRow) api.Fingerprint {
	var m api.RunMeta
	_ = json.Unmarshal(r.Meta, &m)
	fp := api.Fingerprint{Model: m.Model, Params: m.Params, WorldSize: m.WorldSize, MicroBatch: m.MicroBatch}
	fp.Precision, fp.Parallelism = layoutOf(r, m)
	return fp
}

// sameFingerprint compares two fingerprints by value.
func sameFingerprint(a, b api.Fingerprint) bool {
	eq := func(x, y *int64) bool { return (x == nil) == (y == nil) && (x == nil || *x == *y) }
	i64 := func(p *int) *int64 {
		if p == nil {
			return nil
		}
		v := int64(*p)
		return &v
	}
	return a.Model == b.Model && a.Precision == b.Precision && a.Parallelism == b.Parallelism &&
		eq(a.Params, b.Params) && eq(i64(a.WorldSize), i64(b.WorldSize)) && eq(i64(a.MicroBatch), i64(b.MicroBatch))
}

// profileOf reads a run's steady state (detect.RunProfile): its ranks'
// steady aggregates (rollups past the raw budget), its layers' means,
// its code, config, versions, hosts and GPU samples over the steady
// window. The work is bounded per run whatever its length.
func (h *Handler) profileOf(ctx context.Context, r *store.RunRow, pc profileCache) (*runProfile, error) {
	if p, ok := pc[r.RunID]; ok {
		return p, nil
	}
	out := &runProfile{p: detect.RunProfile{RunID: r.RunID, Phases: map[string]float64{}, Ranks: map[int]detect.RankWork{}}}
	pc[r.RunID] = out
	ranks, err := h.store.RunRanks(ctx, r.RunID)
	if err != nil || len(ranks) == 0 {
		return out, err
	}
	from, err := h.steadyFrom(ctx, r.RunID, ranks[0])
	if err != nil {
		return nil, err
	}
	agg, err := h.steadyRanks(ctx, r.RunID, from, -1)
	if err != nil {
		return nil, err
	}
	if len(agg) == 0 {
		return out, nil
	}
	p := &out.p
	out.ok = true
	p.StepMS = meanOf(agg, func(a store.SteadyRank) *float64 { return a.StepMS })
	if p.StepMS == nil {
		out.ok = false
		return out, nil
	}
	var sps *float64
	for _, a := range agg {
		if a.ThroughputSPS != nil {
			if sps == nil {
				sps = new(float64)
			}
			*sps += *a.ThroughputSPS
		}
	}
	if sps == nil && *p.StepMS > 0 {
		// Steps per second, each rank's: samples/s when the micro batch
		// is one sample.
		v := 1000 / *p.StepMS * float64(len(agg))
		sps = &v
	}
	p.ThroughputSPS = sps
	p.MFU = meanOf(agg, func(a store.SteadyRank) *float64 { return a.MFU })
	p.PeakMemGB = maxOf(agg, func(a store.SteadyRank) *float64 {
		if a.MaxGPUMemUsedGB != nil {
			return a.MaxGPUMemUsedGB
		}
		return a.PeakGPUMemGB
	})
	for name, get := range map[string]func(store.SteadyRank) *float64{
		"forward_ms": func(a store.SteadyRank) *float64 { return a.ForwardMS }, "backward_ms": func(a store.SteadyRank) *float64 { return a.BackwardMS },
		"optimizer_ms": func(a store.SteadyRank) *float64 { return a.OptimizerMS }, "data_ms": func(a store.SteadyRank) *float64 { return a.DataMS },
		"comm_exposed_ms": func(a store.SteadyRank) *float64 { return a.CommExposedMS },
	} {
		if v := meanOf(agg, get); v != nil {
			p.Phases[name] = *v
		}
	}
	for _, a := range agg {
		w := detect.RankWork{}
		if a.DataMS != nil {
			w.DataMS = *a.DataMS
		}
		switch {
		case a.ForwardMS != nil && a.BackwardMS != nil:
			w.ComputeMS = *a.ForwardMS + *a.BackwardMS
			if a.OptimizerMS != nil {
				w.ComputeMS += *a.OptimizerMS
			}
		default:
			continue
		}
		p.Ranks[a.Rank] = w
	}
	if p.RankHost, err = h.store.RankHosts(ctx, r.RunID); err != nil {
		return nil, err
	}
	for _, host := range p.RankHost {
		if host != "" && !slices.Contains(p.Hosts, host) {
			p.Hosts = append(p.Hosts, host)
		}
	}
	var m api.RunMeta
	_ = json.Unmarshal(r.Meta, &m)
	if len(p.Hosts) == 0 && m.Host != "" {
		p.Hosts = []string{m.Host}
	}
	sort.Strings(p.Hosts)
	p.GitCommit, p.Versions = m.GitCommit, m.Versions
	p.Config = flatten(r.Config)
	if len(r.LayerNames) > 0 {
		if p.Layers, err = h.store.LayerMeans(ctx, r.RunID, ranks[0], from, r.LayerNames); err != nil {
			return nil, err
		}
	}
	code, err := h.store.RunCode(ctx, r.RunID)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	var rc api.RunCode
	if len(code) > 0 && json.Unmarshal(code, &rc) == nil && rc.GitDiff != "" {
		sum := sha256.Sum256([]byte(rc.GitDiff))
		p.DiffHash = "sha256:" + hex.EncodeToString(sum[:6])
	}
	out.from, out.to = steadyWindow(agg)
	if p.GPU, err = h.store.GPUWindow(ctx, r.RunID, out.from, out.to); err != nil {
		return nil, err
	}
	return out, nil
}

// flatten turns a JSON object into dotted keys and their JSON values,
// at most 500 keys (the rest are left out).
func flatten(raw json.RawMessage) map[string]string {
	out := map[string]string{}
	var v any
	if len(raw) == 0 || json.Unmarshal(raw, &v) != nil {
		return out
	}
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		if len(out) >= 500 {
			return
		}
		if o, ok := v.(map[string]any); ok && len(o) > 0 {
			for _, k := range slices.Sorted(maps.Keys(o)) {
				key := k
				if prefix != "" {
					key = prefix + "." + k
				}
				walk(key, o[k])
			}
			return
		}
		b, _ := json.Marshal(v)
		out[prefix] = string(b)
	}
	walk("", v)
	return out
}

// DriftInput reads what the drift detector needs of a run: its lowest
// rank's step blocks from its steady state on and its GPU samples over
// the reference window and the newest DriftFor of blocks.
func (h *Handler) DriftInput(ctx context.Context, runID string, cfg detect.Config) (*detect.DriftInput, error) {
	ranks, err := h.store.RunRanks(ctx, runID)
	if err != nil || len(ranks) == 0 {
		return nil, err
	}
	from, err := h.steadyFrom(ctx, runID, ranks[0])
	if err != nil {
		return nil, err
	}
	blocks, err := h.store.StepBlocks(ctx, runID, ranks[0], from)
	if err != nil {
		return nil, err
	}
	in := &detect.DriftInput{Blocks: blocks}
	ref, rest := detect.DriftWindow(blocks)
	if len(ref) == 0 || len(rest) == 0 {
		return in, nil
	}
	if in.Ref, err = h.store.GPUWindow(ctx, runID, ref[0].FirstTime, ref[len(ref)-1].LastTime); err != nil {
		return nil, err
	}
	last := rest[len(rest)-1].LastTime
	if in.Recent, err = h.store.GPUWindow(ctx, runID, last.Add(-time.Duration(cfg.DriftFor)), last); err != nil {
		return nil, err
	}
	return in, nil
}
