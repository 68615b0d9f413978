package ingest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/internal/httplimit"
	"github.com/deepseed/deepseed/store"
)

// Importing a training_metrics.json export: ParseExport turns it into the
// records of one run (the field conversions are in import_parser.go, the
// derived step times in import_derive.go) and POST /import stores them.

// ImportOptions names the run an export becomes.
type ImportOptions struct {
	// RunID of the run; empty derives one from a hash of the export, so
	// importing the same file again changes nothing.
	RunID   string
	Project string
	Name    string
	// Start is the run's start when the export's steps carry no times;
	// zero means now minus the export's total_time_minutes.
	Start time.Time
}

// ImportError says what is wrong with an export, and where.
type ImportError struct {
	Where string // "meta", "steps[12]", "evaluations[0]", …
	Field string
	Msg   string
}

func (e *ImportError) Error() string {
	s := e.Where
	if e.Field != "" {
		s += ": field " + e.Field
	}
	return s + ": " + e.Msg
}

// export is the seed dashboard's training_metrics.json, loosely typed
// because its field names vary between versions of the notebook.
type export struct {
	Meta        map[string]json.RawMessage   `json:"meta"`
	Steps       []map[string]json.RawMessage `json:"steps"`
	Evaluations []map[string]json.RawMessage `json:"evaluations"`
	ZeroMemory  map[string]json.RawMessage   `json:"zero_memory"`
}

// ExportRunID is the run id an export gets when none is given: a hash of
// its bytes, so a re-import lands on the same run.
func ExportRunID(body []byte) string {
	sum := sha256.Sum256(body)
	return "import-" + hex.EncodeToString(sum[:8])
}

// ParseExport turns a training_metrics.json export into the records of one
// complete run: the run, its steps with per-layer times, evaluations, the
// ZeRO memory breakdown and its end. Every record is validated as if it
// had come through POST /ingest.
func ParseExport(body []byte, opt ImportOptions) ([]api.Record, error) {
	var ex export
	norm := api.NormalizeJSON(body)
	if err := json.Unmarshal(norm, &ex); err != nil {
		return nil, &ImportError{Where: "export", Msg: "not a training_metrics.json object: " + err.Error()}
	}
	if k := api.DuplicateKey(norm); k != "" {
		return nil, &ImportError{Where: "export", Msg: fmt.Sprintf("key %q appears twice in one object; send each key once", k)}
	}
	if len(ex.Steps) == 0 && len(ex.Evaluations) == 0 {
		return nil, &ImportError{Where: "export", Field: "steps", Msg: "missing or empty (want meta, steps, evaluations, zero_memory)"}
	}
	runID := opt.RunID
	if runID == "" {
		runID = ExportRunID(body)
	}
	p := &exportParser{runID: runID}
	meta := p.meta(ex.Meta, ex.ZeroMemory)
	if p.err != nil {
		return nil, p.err
	}

	// Step numbers and times: from the record when it has them; otherwise
	// spread over the run's total time (or a second a step) from Start.
	steps := make([]int64, len(ex.Steps))
	var maxStep int64
	for i, s := range ex.Steps {
		where := fmt.Sprintf("steps[%d]", i)
		n, ok := p.int(where, s, "step", "global_step")
		if !ok {
			n = int64(i)
		}
		steps[i] = n
		maxStep = max(maxStep, n)
	}
	total := p.float("meta", ex.Meta, "total_time_minutes")
	span := time.Duration(maxStep) * time.Second
	if total != nil && *total > 0 && !math.IsInf(*total, 0) {
		span = time.Duration(*total * float64(time.Minute))
	}
	times := make([]time.Time, len(ex.Steps))
	var first time.Time
	for i, s := range ex.Steps {
		times[i] = p.time(fmt.Sprintf("steps[%d]", i), s)
		if !times[i].IsZero() && (first.IsZero() || times[i].Before(first)) {
			first = times[i]
		}
	}
	start := opt.Start
	switch {
	case !first.IsZero():
		start = first
	case start.IsZero():
		start = api.Now().Add(-span).Truncate(time.Second)
	}
	timeOf := func(step int64) time.Time {
		if maxStep == 0 {
			return start
		}
		return start.Add(time.Duration(float64(span) * float64(step) / float64(maxStep)))
	}

	name := opt.Name
	if name == "" {
		name = meta.Model
	}
	recs := []api.Record{{Run: &api.Run{Kind: api.KindRun, RunID: runID, Project: opt.Project, Name: name,
		StartedAt: api.T(start), Meta: meta, Tags: []string{"imported"}}}}

	last := start
	stepRecs := make([]*api.Step, len(ex.Steps))
	for i, s := range ex.Steps {
		where := fmt.Sprintf("steps[%d]", i)
		t := times[i]
		if t.IsZero() {
			t = timeOf(steps[i])
		}
		if t.After(last) {
			last = t
		}
		st, layers := p.step(where, s, runID, steps[i], t)
		if p.err != nil {
			return nil, p.err
		}
		stepRecs[i] = st
		recs = append(recs, api.Record{Step: st})
		if layers != nil {
			recs = append(recs, api.Record{Layers: layers})
		}
	}
	deriveStepTimes(stepRecs, steps, times, meta)
	for i, e := range ex.Evaluations {
		where := fmt.Sprintf("evaluations[%d]", i)
		n, ok := p.int(where, e, "step", "global_step")
		if !ok {
			return nil, &ImportError{Where: where, Field: "step", Msg: "missing"}
		}
		t := p.time(where, e)
		if t.IsZero() {
			t = timeOf(n)
		}
		ev := &api.Eval{Kind: api.KindEval, RunID: runID, Step: &n, Time: api.T(t), Split: "val",
			Loss:     p.apiFloat(where, e, "val_loss", "loss"),
			Accuracy: p.apiFloat(where, e, "val_accuracy", "accuracy", "val_acc", "acc"),
			F1:       p.apiFloat(where, e, "val_f1", "f1"),
		}
		recs = append(recs, api.Record{Eval: ev})
	}
	if mem := p.memory(ex.ZeroMemory, runID, start); mem != nil {
		recs = append(recs, api.Record{Memory: mem})
	}
	if total != nil && *total > 0 && start.Add(span).After(last) {
		last = start.Add(span)
	}
	summary := map[string]json.RawMessage{}
	for _, k := range []string{"final_accuracy", "final_f1", "total_time_minutes", "final_loss"} {
		if v, ok := ex.Meta[k]; ok && string(v) != "null" {
			summary[k] = v
		}
	}
	end := &api.End{Kind: api.KindEnd, RunID: runID, Time: api.T(last), Status: api.StatusFinished}
	if len(summary) > 0 {
		end.Summary, _ = json.Marshal(summary)
	}
	recs = append(recs, api.Record{End: end})
	if p.err != nil {
		return nil, p.err
	}
	return validateRecords(recs)
}

// validateRecords runs every record through the ingest decoder, so an
// import obeys exactly the rules of POST /ingest.
func validateRecords(recs []api.Record) ([]api.Record, error) {
	out := make([]api.Record, 0, len(recs))
	for _, r := range recs {
		var v any
		switch {
		case r.Run != nil:
			v = r.Run
		case r.Step != nil:
			v = r.Step
		case r.Layers != nil:
			v = r.Layers
		case r.Eval != nil:
			v = r.Eval
		case r.Memory != nil:
			v = r.Memory
		case r.End != nil:
			v = r.End
		}
		js, err := json.Marshal(v)
		if err != nil {
			return nil, &ImportError{Where: r.Kind(), Msg: err.Error()}
		}
		rec, rerr := api.DecodeRecord(js)
		if rerr != nil {
			where := r.Kind()
			if r.Step != nil {
				where = fmt.Sprintf("steps (step %d)", *r.Step.Step)
			} else if r.Layers != nil {
				where = fmt.Sprintf("steps (step %d) layer_times", *r.Layers.Step)
			} else if r.Eval != nil {
				where = fmt.Sprintf("evaluations (step %d)", *r.Eval.Step)
			}
			return nil, &ImportError{Where: where, Field: rerr.Field, Msg: rerr.Msg}
		}
		out = append(out, rec)
	}
	return out, nil
}

func (h *Handler) importExport(c echo.Context) error {
	// The parsed export may keep parts of the body, so its buffers are
	// left to the collector rather than released for reuse.
	body, lease, herr := h.readBody(c, httplimit.ReadBodyLease)
	lease.KeepBody()
	defer lease.Release()
	if herr != nil {
		h.m.rejectedTotal("body").Inc()
		return h.answerError(c, herr)
	}
	q := c.QueryParams()
	opt := ImportOptions{RunID: q.Get("run_id"), Project: q.Get("project"), Name: q.Get("name")}
	if opt.RunID == "" {
		opt.RunID = ExportRunID(body)
	}
	// The check of where the run is stored and the write are one decision:
	// imports of one run wait for each other (on every server of the
	// database), so of imports racing into different projects exactly one
	// stores the run and the others are answered 409.
	var res api.IngestResult
	var recs []api.Record
	var answer *httpError
	err := h.store.WithImportLock(c.Request().Context(), opt.RunID, func() error {
		res, recs, answer = h.importLocked(c, body, opt)
		return nil
	})
	if err != nil {
		if httplimit.ClientGone(c.Request()) {
			return h.answerError(c, clientGone)
		}
		return h.answerError(c, h.storeError(err, "lock the run for import"))
	}
	if answer != nil {
		return h.answerError(c, answer)
	}
	res.RunIDs = []string{opt.RunID}
	h.log.Info("imported export", "run_id", opt.RunID, "records", len(recs), "duplicates", res.Duplicates)
	return c.JSON(http.StatusOK, res)
}

// importLocked is an import under the run's import lock: where the run is
// stored, the records of the export, and their write.
func (h *Handler) importLocked(c echo.Context, body []byte, opt ImportOptions) (res api.IngestResult, recs []api.Record, herr *httpError) {
	// A re-import of an export without step times must land on the same
	// times as the first one, or it would count as a resumed run.
	ctx, cancel := context.WithTimeout(c.Request().Context(), 10*time.Second)
	start, found, err := h.store.RunStartedAt(ctx, opt.RunID)
	cancel()
	if err != nil {
		return api.IngestResult{}, nil, h.storeError(err, "read run")
	}
	if found {
		opt.Start = start
	}
	// The run id of an export comes from its contents, so importing the
	// same file into another project names the same run: that would move
	// a run between projects unasked. It is refused; without a project
	// the run stays where it is.
	if found && opt.Project != "" {
		ctx, cancel := context.WithTimeout(c.Request().Context(), 10*time.Second)
		stored, _, err := h.store.RunProject(ctx, opt.RunID)
		cancel()
		if err != nil {
			return api.IngestResult{}, nil, h.storeError(err, "read run")
		}
		if stored != opt.Project {
			return api.IngestResult{}, nil, &httpError{status: http.StatusConflict, body: api.Error{Error: fmt.Sprintf(
				"run %s is already stored in project %q, nothing stored: import it again into %q (or with no project), or give it another run_id to store it as a second run in %q",
				opt.RunID, stored, stored, opt.Project)}}
		}
	}
	recs, err = ParseExport(body, opt)
	if err != nil {
		h.m.rejectedTotal("body").Inc()
		var ie *ImportError
		if errors.As(err, &ie) {
			return api.IngestResult{}, nil, &httpError{status: http.StatusBadRequest, body: api.Error{Error: "invalid export, nothing stored: " + ie.Error(),
				Record: &api.RecordError{Kind: ie.Where, Field: ie.Field, Msg: ie.Msg}}}
		}
		return api.IngestResult{}, nil, badRequest("invalid export, nothing stored: " + err.Error())
	}
	res, herr = h.write(c.Request(), recs, nil)
	return res, recs, herr
}

func (h *Handler) storeError(err error, what string) *httpError {
	if store.IsDataError(err) {
		return &httpError{status: http.StatusBadRequest,
			body: api.Error{Error: what + ": the database refused a value, nothing stored: " + store.DataErrorMessage(err)}}
	}
	if store.IsUnavailable(err) {
		h.log.Warn("database unavailable, asking the sender to retry", "op", what, "err", err)
		return &httpError{status: http.StatusServiceUnavailable,
			body: api.Error{Error: fmt.Sprintf("database unavailable, retry in %d s", RetryAfterSeconds)}}
	}
	h.log.Error(what, "err", err)
	return &httpError{status: http.StatusInternalServerError, body: api.Error{Error: what + " failed"}}
}
