package collector

// SetNoSync turns the spool's syncs off until the returned function is
// called, for the durability benchmark.
func SetNoSync(v bool) (restore func()) {
	old := noSync
	noSync = v
	return func() { noSync = old }
}

// SpoolWrites counts the batches written to c's spool since it started.
func SpoolWrites(c *Collector) int64 { return c.spool.writes.Load() }
