package localpg_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/deepseed/deepseed/internal/localpg"
	"github.com/deepseed/deepseed/store"
	"github.com/deepseed/deepseed/store/storetest"
)

// A private cluster left running by a process that died without stopping
// it (kill -9) must not keep the next server from starting.
func TestLocalPostgresTakesOverLeftoverCluster(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(storetest.DataDir(t), "pg")
	first := &localpg.Cluster{Dir: dir}
	if _, err := first.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// The first owner vanishes without calling Stop.
	second := &localpg.Cluster{Dir: dir}
	u, err := second.Start(ctx)
	if err != nil {
		t.Fatalf("start over a leftover cluster: %v", err)
	}
	defer second.Stop()
	s, err := store.Open(ctx, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("second cluster does not answer: %v", err)
	}
}
