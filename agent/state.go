package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// stateFile keeps the jobs an agent runs, so that after a restart it
// re-adopts the ones still alive and reports the others.
type stateFile struct {
	path string
}

// heldJob is one job an agent holds, as kept on disk.
type heldJob struct {
	ID     int64  `json:"id"`
	GPUIDs []int  `json:"gpu_ids"`
	Handle Handle `json:"handle"`
	// Reported is the last state sent to the server.
	Reported string `json:"reported"`
	// Cancelling is set once a cancel has been forwarded.
	Cancelling bool `json:"cancelling,omitempty"`
	// Starting is set while the executor starts the job, before its
	// handle is known: a restarted agent then looks for it (Finder).
	Starting bool `json:"starting,omitempty"`

	dropping bool      // being stopped because the server no longer counts it ours
	first    *Status   // the executor's answer right after Start, when it had already ended: the next poll reports it
	tail     string    // the output tail last reported
	tailAt   time.Time // when
}

type stateDoc struct {
	Agent string     `json:"agent"`
	Jobs  []*heldJob `json:"jobs"`
}

func (s stateFile) load() (stateDoc, error) {
	var d stateDoc
	b, err := os.ReadFile(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		return d, nil
	}
	if err != nil {
		return d, fmt.Errorf("read agent state: %w", err)
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return d, fmt.Errorf("agent state %s is damaged: %w", s.path, err)
	}
	return d, nil
}

// save writes the state whole, through a temporary file and a rename, so
// a crash leaves the old state or the new one.
func (s stateFile) save(d stateDoc) error {
	b, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return err
	}
	tmp := s.path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("write agent state: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("write agent state: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("write agent state: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write agent state: %w", err)
	}
	if err := os.Rename(tmp, s.path); err != nil {
		return fmt.Errorf("write agent state: %w", err)
	}
	if dir, err := os.Open(filepath.Dir(s.path)); err == nil {
		_ = dir.Sync()
		dir.Close()
	}
	return nil
}
