package api_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/deepseed/deepseed/api"
)

// TestDecodeBatchWithinRows: the bound is on rows, in both body forms, and
// names the record that passed it.
func TestDecodeBatchWithinRows(t *testing.T) {
	steps := func(from, n int) string {
		s := make([]string, n)
		for i := range s {
			s[i] = fmt.Sprint(from + i)
		}
		return `{"kind":"steps","run_id":"r","rank":0,"step":[` + strings.Join(s, ",") + `]}`
	}
	step := `{"kind":"step","run_id":"r","rank":0,"step":99}`
	for _, tc := range []struct {
		name, body string
		max        int
		want       string // "" when it fits
	}{
		{"ndjson fits", steps(0, 6) + "\n" + step, 7, ""},
		{"ndjson past", step + "\n" + steps(0, 6) + "\n" + steps(6, 1), 7, "at line 3"},
		{"one record past", steps(0, 8), 7, "at line 1"},
		{"array past", "[" + steps(0, 4) + "," + steps(4, 4) + "]", 7, "at record 1"},
		{"array of plain records past", "[" + step + "," + step + "]", 1, "at record 1"},
		{"repeats merged", steps(0, 3) + "\n" + `{"kind":"steps","run_id":"r","rank":0,"step":[5,5,5,5]}`, 7, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			recs, err := api.DecodeBatchWithin([]byte(tc.body), tc.max)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var re *api.RowsError
			if !errors.As(err, &re) || re.Max != tc.max || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %d records, %v; want a RowsError %s", len(recs), err, tc.want)
			}
		})
	}
}

// TestDecodeStepsRepeatedOnce: a step repeated in one steps record is
// decoded once, with its first values; out of order steps are kept.
func TestDecodeStepsRepeatedOnce(t *testing.T) {
	recs, err := api.DecodeBatch([]byte(`{"kind":"steps","run_id":"r","rank":0,"step":[3,1,3,2,1],"loss":[1,2,3,4,5]}`))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range api.ExpandSteps(recs) {
		got = append(got, fmt.Sprintf("%d:%v", *r.Step.Step, *r.Step.Loss))
	}
	if strings.Join(got, " ") != "3:1 1:2 2:4" {
		t.Fatalf("decoded %v", got)
	}
}
