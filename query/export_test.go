package query

// SetScoreRowBudget sets the rank-steps past which straggler scores are
// computed from rollups, and returns the function restoring it.
func SetScoreRowBudget(n int64) (restore func()) {
	old := scoreRowBudget
	scoreRowBudget = n
	return func() { scoreRowBudget = old }
}
