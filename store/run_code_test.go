package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// The code sent with a run is stored once and kept when later run records
// (meta updates) come without it; a newer copy replaces it.
func TestRunCodeKeptAcrossRunUpdates(t *testing.T) {
	s := storetest.NewStore(t)
	ctx := context.Background()
	if _, err := s.RunCode(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown run: err = %v, want ErrNotFound", err)
	}
	mustWrite(t, s, `{"kind":"run","run_id":"r","project":"p"}`)
	if code, err := s.RunCode(ctx, "r"); err != nil || code != nil {
		t.Fatalf("run without code: %s, %v", code, err)
	}
	mustWrite(t, s, `{"kind":"run","run_id":"r","project":"p","code":{"entry_path":"train.py","source":"print(1)\n","source_bytes":9,"git_diff":"diff --git a/x b/x\n","git_diff_bytes":700000,"git_diff_truncated":true}}`)
	mustWrite(t, s, `{"kind":"run","run_id":"r","meta":{"seq_len":512}}`)
	read := func() api.RunCode {
		t.Helper()
		raw, err := s.RunCode(ctx, "r")
		if err != nil {
			t.Fatal(err)
		}
		var c api.RunCode
		if err := json.Unmarshal(raw, &c); err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		return c
	}
	c := read()
	if c.EntryPath != "train.py" || c.Source != "print(1)\n" || c.SourceBytes != 9 || c.SourceTruncated ||
		c.GitDiff != "diff --git a/x b/x\n" || c.GitDiffBytes != 700000 || !c.GitDiffTrunc {
		t.Fatalf("code after a meta update = %+v", c)
	}
	mustWrite(t, s, `{"kind":"run","run_id":"r","code":{"entry_path":"train2.py","source":"print(2)\n"}}`)
	if c := read(); c.EntryPath != "train2.py" || c.GitDiff != "" {
		t.Fatalf("newer code = %+v", c)
	}
}
