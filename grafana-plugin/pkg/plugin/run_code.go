package plugin

import (
	"fmt"
	"strings"

	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/api"
)

// runCodeQuery is a run's entry script and git diff, from GET
// /runs/{id}/code.
var runCodeQuery = get[api.RunCodeResponse]{
	path:   runPathOf("code"),
	frames: func(_ request, c api.RunCodeResponse) data.Frames { return data.Frames{runCodeFrame(c)} },
}

// codeLine is one line of the code that produced a run.
type codeLine struct {
	file string
	line int64
	text string
}

// runCodeFrame is the code that produced a run as a table of lines: the
// entry script, then the git diff of uncommitted changes, each numbered
// from 1, with a last line saying when the hook cut it.
func runCodeFrame(r api.RunCodeResponse) *data.Frame {
	var rows []codeLine
	add := func(file, text string, cut bool, full int64) {
		if text == "" {
			return
		}
		lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
		for i, l := range lines {
			rows = append(rows, codeLine{file, int64(i + 1), l})
		}
		if cut {
			rows = append(rows, codeLine{file, int64(len(lines) + 1),
				fmt.Sprintf("… cut: %d of %d bytes shown", api.MaxCodeText, full)})
		}
	}
	entry := r.EntryPath
	if entry == "" {
		entry = "entry script"
	}
	add(entry, r.Source, r.SourceTruncated, r.SourceBytes)
	add("git diff HEAD", r.GitDiff, r.GitDiffTrunc, r.GitDiffBytes)
	file := make([]string, len(rows))
	line := make([]int64, len(rows))
	text := make([]string, len(rows))
	for i, c := range rows {
		file[i], line[i], text[i] = c.file, c.line, c.text
	}
	f := data.NewFrame("run_code",
		data.NewField("file", nil, file).SetConfig(&data.FieldConfig{DisplayNameFromDS: "File"}),
		data.NewField("line", nil, line).SetConfig(&data.FieldConfig{DisplayNameFromDS: "Line", Unit: "none"}),
		data.NewField("text", nil, text).SetConfig(&data.FieldConfig{DisplayNameFromDS: "Code"}),
	)
	if len(rows) == 0 {
		// A table of no rows shows its headers only: the notice says why.
		f.AppendNotices(data.Notice{Severity: data.NoticeSeverityInfo,
			Text: "no code captured: the run was imported, or started with DEEPSEED_CAPTURE_CODE=0"})
	}
	return f
}
