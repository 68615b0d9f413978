package collector

import (
	"time"

	"github.com/deepseed/deepseed/api"
)

// SetNoSync turns the spool's syncs off until the returned function is
// called, for the durability benchmark.
func SetNoSync(v bool) (restore func()) {
	old := noSync
	noSync = v
	return func() { noSync = old }
}

// SpoolWrites counts the batches written to c's spool since it started.
func SpoolWrites(c *Collector) int64 { return c.spool.writes.Load() }

// SetMinBackoff sets the first wait after a failed send until the returned
// function is called, so that tests can fail many sends quickly.
func SetMinBackoff(d time.Duration) (restore func()) {
	old := minBackoff
	minBackoff = d
	return func() { minBackoff = old }
}

// SampleDue samples what is due at now, as Run's loop does, and returns
// when the next sample is due.
func SampleDue(c *Collector, now time.Time) time.Time { return c.sampleDue(now) }

// LastGPURecord is the latest record of GPU i.
func LastGPURecord(c *Collector, i int) api.GPU { return c.gpu.dev[i].state.rec }

// Announced is the number of training processes announced to c.
func Announced(c *Collector) int { return len(c.reg.list()) }
