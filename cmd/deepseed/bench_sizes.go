package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/deepseed/deepseed/store"
)

// printTableSizes writes the table of bench query --database-url: every
// table's bytes and bytes per rank-step (rankSteps: the rank-steps of the
// runs written), raw and derived totals, and dead row versions.
func printTableSizes(ctx context.Context, w io.Writer, url string, rankSteps int64) error {
	sizes, err := store.TableSizes(ctx, url)
	if err != nil {
		return fmt.Errorf("bench query: table sizes: %w", err)
	}
	per := func(b int64) string {
		if rankSteps <= 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f", float64(b)/float64(rankSteps))
	}
	fmt.Fprintf(w, "\ntables, per rank-step of the %d rank-steps written:\n", rankSteps)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "table\tkind\tMB\tB/rank-step\tlive rows\tdead rows\tchunks compressed\t")
	var raw, derived int64
	for _, s := range sizes {
		kind := "raw"
		if s.Derived {
			kind = "derived"
			derived += s.Bytes
		} else {
			raw += s.Bytes
		}
		chunks := "-"
		if s.Hypertable {
			chunks = fmt.Sprintf("%d of %d", s.Compressed, s.Chunks)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.1f\t%s\t%d\t%d\t%s\t\n", s.Name, kind, float64(s.Bytes)/1e6, per(s.Bytes), s.Live, s.Dead, chunks)
	}
	fmt.Fprintf(tw, "raw\t\t%.1f\t%s\t\t\t\t\n", float64(raw)/1e6, per(raw))
	fmt.Fprintf(tw, "derived\t\t%.1f\t%s\t\t\t\t\n", float64(derived)/1e6, per(derived))
	return tw.Flush()
}
