package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Poll asks squeue for the job (every state slurmctld still remembers,
// with its exit status), then sacct for the final state of a job that has
// ended, and, where accounting is disabled or sacct is missing and
// slurmctld has already forgotten the job (MinJobAge), reads the exit
// file the batch script wrote. A job found nowhere is lost. A job this
// executor stopped with Cancel ends as cancelled.
func (s *Slurm) Poll(ctx context.Context, h Handle) (Status, error) {
	id, err := slurmJobID(h)
	if err != nil {
		return Status{}, err
	}
	st, err := s.poll(ctx, id, h.OutputPath)
	if err != nil {
		return Status{}, err
	}
	if s.wasCancelled(id) {
		st = asCancelled(st)
	}
	st.OutputTail = readTail(h.OutputPath, s.cfg.TailBytes, 0)
	return st, nil
}

func (s *Slurm) poll(ctx context.Context, id, out string) (Status, error) {
	q, err := s.squeue(ctx, id)
	if err != nil {
		return Status{}, err
	}
	var st Status
	if q.found && !finalSlurmState(q.state) {
		st.State, st.Detail = mapSlurmState(q.state, q.reason)
		return st, nil
	}
	a, acctErr := s.sacct(ctx, id)
	switch {
	case a.found:
		st.State, st.Detail = mapSlurmState(a.state, "")
		st.ExitCode, st.Detail = exitStatus(a.exit, a.signal, st.Detail)
		return st, nil
	case q.found:
		st.State, st.Detail = mapSlurmState(q.state, q.reason)
		st.ExitCode, st.Detail = exitStatus(q.exit, q.signal, st.Detail)
		return st, nil
	}
	if code, ok := readExitFile(exitPath(out)); out != "" && ok {
		st.ExitCode = &code
		if fi, err := os.Stat(exitPath(out)); err == nil {
			st.EndedAt = fi.ModTime()
		}
		if code == 0 {
			st.State = StateFinished
		} else {
			st.State, st.Detail = StateFailed, fmt.Sprintf("exit status %d (from the job's exit file; Slurm no longer knows the job)", code)
		}
		return st, nil
	}
	if acctErr != nil {
		// Accounting failed for a reason other than being switched off:
		// the job may well be there, so do not call it lost.
		return Status{}, acctErr
	}
	st.State = StateLost
	st.Detail = fmt.Sprintf("slurm: job %s is unknown to squeue and sacct and left no exit file", id)
	return st, nil
}

// slurmJob is what squeue or sacct says of a job.
type slurmJob struct {
	found        bool
	state        string // Slurm's state name, for example RUNNING
	reason       string // squeue's reason, for example Resources
	exit, signal int
}

// squeue asks for the job in every state slurmctld still remembers.
func (s *Slurm) squeue(ctx context.Context, id string) (slurmJob, error) {
	out, err := s.run(ctx, s.cfg.Squeue, "--noheader", "--states=all", "--jobs="+id,
		"--Format=JobID:|,State:|,exit_code:|,Reason:256|")
	if err != nil {
		if goneError(err) {
			return slurmJob{}, nil
		}
		return slurmJob{}, err
	}
	return parseSqueue(string(out), id)
}

// parseSqueue reads squeue's "id|STATE|waitstatus|reason|" line of job id.
// exit_code is the raw wait status: exit status in the high byte, signal
// in the low seven bits.
func parseSqueue(out, id string) (slurmJob, error) {
	for _, line := range strings.Split(out, "\n") {
		f := strings.SplitN(strings.TrimSpace(line), "|", 4)
		if len(f) < 4 || strings.TrimSpace(f[0]) != id {
			continue
		}
		j := slurmJob{found: true, state: baseState(f[1]), reason: strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(f[3]), "|"))}
		if w := strings.TrimSpace(f[2]); w != "" && w != "N/A" {
			ws, err := strconv.Atoi(w)
			if err != nil {
				return slurmJob{}, fmt.Errorf("slurm: squeue: job %s: exit code %q: %w", id, w, err)
			}
			j.exit, j.signal = ws>>8&0xff, ws&0x7f
		}
		return j, nil
	}
	return slurmJob{}, nil
}

// sacct asks accounting for the job's allocation record. A missing sacct
// or disabled accounting is no error: it finds nothing.
func (s *Slurm) sacct(ctx context.Context, id string) (slurmJob, error) {
	if s.cfg.Sacct == "" {
		return slurmJob{}, nil
	}
	out, err := s.run(ctx, s.cfg.Sacct, "--noheader", "--parsable2", "--allocations",
		"--jobs="+id, "--format=JobID,State,ExitCode")
	if err != nil {
		var ce *CommandError
		if errors.As(err, &ce) && strings.Contains(ce.Stderr, "accounting storage is disabled") {
			return slurmJob{}, nil
		}
		return slurmJob{}, err
	}
	return parseSacct(string(out), id)
}

// parseSacct reads sacct's "id|STATE[ by uid]|exit:signal" line of job id.
func parseSacct(out, id string) (slurmJob, error) {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Split(strings.TrimSpace(line), "|")
		if len(f) != 3 || f[0] != id {
			continue
		}
		j := slurmJob{found: true, state: baseState(f[1])}
		e, sig, ok := strings.Cut(f[2], ":")
		var err1, err2 error
		j.exit, err1 = strconv.Atoi(e)
		j.signal, err2 = strconv.Atoi(sig)
		if !ok || err1 != nil || err2 != nil {
			return slurmJob{}, fmt.Errorf("slurm: sacct: job %s: exit code %q: want exit:signal", id, f[2])
		}
		return j, nil
	}
	return slurmJob{}, nil
}

// baseState drops what follows the state name ("CANCELLED by 0", flags).
func baseState(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexAny(s, " +"); i >= 0 {
		s = s[:i]
	}
	return strings.ToUpper(s)
}

// finalSlurmState reports whether a Slurm state is one a job ends in.
func finalSlurmState(state string) bool {
	switch st, _ := mapSlurmState(state, ""); st {
	case StateFinished, StateFailed, StateCancelled:
		return true
	}
	return false
}

// mapSlurmState maps a Slurm job state to a DeepSeed one, with a detail
// naming the Slurm state where it says more than the DeepSeed state.
func mapSlurmState(state, reason string) (string, string) {
	detail := "slurm: " + state
	if reason != "" && reason != "None" {
		detail += " (" + reason + ")"
	}
	switch state {
	case "PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD":
		if state == "PENDING" && (reason == "" || reason == "None") {
			return StateQueued, ""
		}
		return StateQueued, detail
	case "RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESIZING":
		if state == "RUNNING" || state == "COMPLETING" {
			return StateRunning, ""
		}
		return StateRunning, detail
	case "COMPLETED":
		return StateFinished, ""
	case "CANCELLED", "REVOKED":
		return StateCancelled, detail
	case "FAILED", "OUT_OF_MEMORY", "TIMEOUT", "NODE_FAIL", "BOOT_FAIL", "DEADLINE", "PREEMPTED", "SPECIAL_EXIT":
		return StateFailed, detail
	}
	// A state this code does not know yet (a newer Slurm): the job is
	// still Slurm's, so it is reported running, with the name.
	return StateRunning, detail
}

// exitStatus turns Slurm's exit:signal into the status's exit code: set
// when the job exited, unset when a signal ended it, which the detail
// then names.
func exitStatus(exit, signal int, detail string) (*int, string) {
	if signal != 0 {
		d := fmt.Sprintf("killed by signal %d", signal)
		if detail != "" {
			d = detail + ", " + d
		}
		return nil, d
	}
	return &exit, detail
}

// readExitFile reads the exit status a job's wrapper (the local
// executor's, or the Slurm batch script) wrote to path: false when there
// is none.
func readExitFile(path string) (int, bool) {
	if path == "" {
		return 0, false
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	code, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, false
	}
	return code, true
}
