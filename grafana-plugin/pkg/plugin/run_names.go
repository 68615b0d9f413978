package plugin

// runLabels are the names a list of runs is shown by: each run's name (its
// id where it has none), and, where two runs of the list share a name (a
// configuration recorded twice), the name followed by the run's short id,
// so that every row, bar and picker entry tells its run apart.
func runLabels(ids, names []string) []string {
	count := make(map[string]int, len(names))
	for i, n := range names {
		if n == "" {
			names[i] = ids[i]
		}
		count[names[i]]++
	}
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = n
		if count[n] > 1 && n != ids[i] {
			out[i] = n + " · " + shortRunID(ids[i])
		}
	}
	return out
}

// shortRunID is a run id cut to its last 8 characters, where ids made
// by the hook differ, with an ellipsis where it was cut.
func shortRunID(id string) string {
	r := []rune(id)
	if len(r) <= 12 {
		return id
	}
	return "…" + string(r[len(r)-8:])
}
