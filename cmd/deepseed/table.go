package main

import (
	"fmt"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/deepseed/deepseed/api"
)

// table writes a listing to stdout as every list command shows one: a
// header of upper-case column names, then one row per item, the columns
// aligned two spaces apart.
type table struct{ w *tabwriter.Writer }

func newTable(header ...any) *table {
	t := &table{w: tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)}
	t.row(header...)
	return t
}

// row writes one row; each cell is written as fmt.Print would.
func (t *table) row(cells ...any) {
	for i, c := range cells {
		if i > 0 {
			fmt.Fprint(t.w, "\t")
		}
		fmt.Fprint(t.w, c)
	}
	fmt.Fprintln(t.w)
}

func (t *table) flush() error { return t.w.Flush() }

// printFields writes the detail of one item as the show commands do:
// label and value, one pair a line, the values aligned.
func printFields(fields [][2]string) error {
	t := &table{w: tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)}
	for _, kv := range fields {
		t.row(kv[0], kv[1])
	}
	return t.flush()
}

// The cells of the tables: "-" stands for a value that is absent.

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func fnum(v *api.Float) string {
	if v == nil {
		return "-"
	}
	return strconv.FormatFloat(float64(*v), 'g', 5, 64)
}

func pct(v *api.Float) string {
	if v == nil {
		return "-"
	}
	return strconv.FormatFloat(float64(*v)*100, 'f', 1, 64) + "%"
}

func when(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}
