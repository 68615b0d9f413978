package ingest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// A write that fails for a reason that passes makes the server not ready
// until a write succeeds, or until no write has come for failingFor; the
// batch's own errors say nothing about the database.
func TestWritesFailing(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h := &Handler{health: writeHealth{now: func() time.Time { return now }}}
	diskFull := fmt.Errorf("store: write steps: %w", &pgconn.PgError{Code: "53100", Message: "could not extend file"})

	h.health.note(errors.New("store: write steps: bad value"))
	if err := h.WritesFailing(); err != nil {
		t.Fatalf("after an error of the batch: %v, want nil", err)
	}
	h.health.note(diskFull)
	if err := h.WritesFailing(); !errors.Is(err, diskFull) {
		t.Fatalf("after a full disk: %v, want it", err)
	}
	h.health.note(nil)
	if err := h.WritesFailing(); err != nil {
		t.Fatalf("after a write that succeeded: %v, want nil", err)
	}
	h.health.note(diskFull)
	now = now.Add(failingFor)
	if err := h.WritesFailing(); err == nil {
		t.Fatal("within failingFor of the failure: nil, want the failure")
	}
	now = now.Add(time.Second)
	if err := h.WritesFailing(); err != nil {
		t.Fatalf("past failingFor with no write since: %v, want nil", err)
	}
}
