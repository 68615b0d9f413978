package agent

import (
	"context"
	"fmt"
	"time"
)

// Cancel stops a job the way the local executor does: SIGTERM first, so
// the command can save a checkpoint, and SIGKILL once grace has passed.
//
// A plain scancel will not do for this: it has Slurm send SIGTERM and,
// after the cluster's KillWait, SIGKILL, and once it has run the job is
// COMPLETING and Slurm refuses any further signal to it, so the grace
// would be the cluster's and not the caller's. So a running job is sent
// scancel --signal=TERM --full (the batch script and every process of the
// job), then, if it is still running after grace, scancel --signal=KILL
// --full. Slurm then records the job as ended by its exit status or
// signal, not as CANCELLED; Poll reports every job this executor has
// stopped as cancelled. A pending job is removed with a plain scancel. A
// job Slurm no longer knows, or one that has already ended, is not an
// error.
func (s *Slurm) Cancel(ctx context.Context, h Handle, grace time.Duration) error {
	id, err := slurmJobID(h)
	if err != nil {
		return err
	}
	q, err := s.squeue(ctx, id)
	if err != nil {
		return err
	}
	if !q.found || finalSlurmState(q.state) {
		return nil
	}
	if st, _ := mapSlurmState(q.state, ""); st == StateQueued {
		// Nothing runs yet: Slurm removes it and records it CANCELLED.
		if _, err := s.run(ctx, s.cfg.Scancel, id); err != nil && !goneError(err) {
			return err
		}
		return nil
	}
	s.markCancelled(id)
	if _, err := s.run(ctx, s.cfg.Scancel, "--signal=TERM", "--full", id); err != nil && !goneError(err) {
		return err
	}
	deadline := time.Now().Add(grace)
	step := min(max(grace/10, 100*time.Millisecond), time.Second)
	for {
		active, err := s.inQueue(ctx, id)
		if err != nil {
			return err
		}
		if !active {
			return nil
		}
		if !time.Now().Before(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("slurm: cancel job %s: %w", id, ctx.Err())
		case <-time.After(step):
		}
	}
	s.log.Warn("job still running after grace; sending SIGKILL", "slurm_job", id, "grace", grace)
	if _, err := s.run(ctx, s.cfg.Scancel, "--signal=KILL", "--full", id); err != nil && !goneError(err) {
		return err
	}
	return nil
}

// inQueue reports whether squeue still lists the job as pending or
// running (including completing).
func (s *Slurm) inQueue(ctx context.Context, id string) (bool, error) {
	q, err := s.squeue(ctx, id)
	if err != nil {
		return false, err
	}
	return q.found && !finalSlurmState(q.state), nil
}

func (s *Slurm) markCancelled(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cancelled[id] = true
}

func (s *Slurm) wasCancelled(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cancelled[id]
}

// asCancelled turns the final status of a job this executor stopped into
// cancelled, keeping how it ended in the detail.
func asCancelled(st Status) Status {
	if st.State != StateFinished && st.State != StateFailed {
		return st
	}
	d := "cancelled"
	if st.Detail != "" {
		d += "; " + st.Detail
	}
	if st.ExitCode != nil {
		d += fmt.Sprintf("; exit status %d", *st.ExitCode)
	}
	st.State, st.Detail = StateCancelled, d
	return st
}
