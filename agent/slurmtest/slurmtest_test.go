package slurmtest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/deepseed/deepseed/agent/slurmtest"
)

// TestStart starts the cluster and checks that its node offers the GPUs
// the tests rely on.
func TestStart(t *testing.T) {
	c := slurmtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := c.Command(ctx, c.Bin.Scontrol, "show", "node", c.Node)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"State=IDLE", "Gres=gpu:2"} {
		if !strings.Contains(out, want) {
			t.Errorf("scontrol show node: no %q in\n%s", want, out)
		}
	}
}
