package plugin

import (
	"testing"

	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/api"
)

// ledgerRows maps each line of a ledger table in words to its value in
// the column shown as display.
func ledgerRows(t *testing.T, f *data.Frame, display string) map[string]*float64 {
	t.Helper()
	lines, vals := column(t, f, "Cause"), column(t, f, display)
	out := map[string]*float64{}
	for i, l := range lines {
		switch v := vals[i].(type) {
		case float64:
			out[l.(string)] = &v
		default:
			out[l.(string)] = nil
		}
	}
	return out
}

// checkLedgerColumn holds one column of a ledger table to what the
// ledger promises: every cause counted, none negative, together at most
// the GPU-hours and equal to the lost line where there is one.
func checkLedgerColumn(t *testing.T, f *data.Frame, display string) map[string]*float64 {
	t.Helper()
	rows := ledgerRows(t, f, display)
	gpuH := rows[ledgerLines[LedgerGPUHours]]
	if gpuH == nil || *gpuH <= 0 {
		t.Fatalf("%s: GPU-hours %v", display, gpuH)
	}
	sum := 0.0
	for _, c := range api.LedgerCauses {
		v := rows[ledgerLines[c]]
		if v == nil || *v < 0 {
			t.Errorf("%s: %s = %v", display, ledgerLines[c], v)
			continue
		}
		sum += *v
	}
	if sum > *gpuH+1e-9 {
		t.Errorf("%s: causes sum to %g of %g GPU-hours", display, sum, *gpuH)
	}
	if lost := rows[ledgerLines[LedgerLost]]; lost != nil && (*lost-sum > 1e-9 || sum-*lost > 1e-9) {
		t.Errorf("%s: lost %g, causes %g", display, *lost, sum)
	}
	return rows
}

// The Lost GPU-hours panels: the runs compared get a column each, a row
// per cause with how it was computed beside it, and the data straggler's
// waits land on data; a project's runs get a column together and one per
// day of their start, every cause at most their GPU-hours.
func TestLedgerTable(t *testing.T) {
	base := corpusServer(t)
	frames := framesOf(t, "ledger", base, `{"queryType":"ledger","runIds":["{base-2,slow}"]}`)
	if len(frames) != 1 {
		t.Fatalf("%d frames", len(frames))
	}
	f := frames[0]
	var shown []string
	for _, fd := range f.Fields {
		shown = append(shown, display(fd))
	}
	if want := []string{"Cause", "base-2", "slow", "How it was computed"}; len(shown) != len(want) || shown[1] != "base-2" || shown[2] != "slow" || shown[3] != want[3] {
		t.Fatalf("columns %v, want %v", shown, want)
	}
	if n := f.Rows(); n != 2+len(api.LedgerCauses) {
		t.Errorf("%d rows, want GPU-hours, lost and %d causes", n, len(api.LedgerCauses))
	}
	for i, h := range column(t, f, "How it was computed") {
		if h == "" {
			t.Errorf("row %d (%v): no how", i, column(t, f, "Cause")[i])
		}
	}
	if u := unit(field(t, f, "run.slow")); u != api.GPUHoursUnit {
		t.Errorf("unit %q, want %q", u, api.GPUHoursUnit)
	}
	slow := checkLedgerColumn(t, f, "slow")
	control := checkLedgerColumn(t, f, "base-2")
	if d := slow[ledgerLines[api.LostStragglerData]]; *d <= 0 {
		t.Errorf("slow: no GPU-hours lost to the data straggler: %v", *d)
	}
	if d := control[ledgerLines[api.LostStragglerData]]; *d > 0 {
		t.Errorf("base-2 (control): %g GPU-hours lost to a data straggler", *d)
	}

	proj := framesOf(t, "ledger", base, `{"queryType":"ledger","project":"corpus"}`)[0]
	all := checkLedgerColumn(t, proj, "All 4 runs")
	if d := all[ledgerLines[api.LostStragglerData]]; *d < *slow[ledgerLines[api.LostStragglerData]]-1e-9 {
		t.Errorf("project: data stragglers %g, less than the slow run's %g", *d, *slow[ledgerLines[api.LostStragglerData]])
	}
	day := checkLedgerColumn(t, proj, "2024-03-01")
	if l := day[ledgerLines[LedgerLost]]; l != nil {
		t.Errorf("a day's lost line: %v; the server sends only its causes", *l)
	}
	if everyProject := framesOf(t, "ledger", base, `{"queryType":"ledger","project":"*"}`)[0]; len(everyProject.Fields) != len(proj.Fields) {
		t.Errorf("every project (the one corpus): %d columns, the project's %d", len(everyProject.Fields), len(proj.Fields))
	}
}
