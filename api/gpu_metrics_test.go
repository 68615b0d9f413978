package api_test

import (
	"flag"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/deepseed/deepseed/api"
)

var update = flag.Bool("update", false, "rewrite the parts of docs/metrics.md and api/openapi.json written from the metric table")

// Every value a gpu record carries is in the metric table, under its
// record's JSON name, and no name, column or /metrics family is there
// twice.
func TestGPUMetricsTableMatchesTheRecord(t *testing.T) {
	typ := reflect.TypeOf(api.GPU{})
	tags := map[uintptr]string{} // field offset → JSON name
	for i := 0; i < typ.NumField(); i++ {
		f := typ.Field(i)
		tags[f.Offset] = strings.Split(f.Tag.Get("json"), ",")[0]
	}
	var g api.GPU
	base := reflect.ValueOf(&g).Pointer()
	inTable := map[string]bool{}
	seen := map[string]bool{}
	once := func(kind, name string) {
		if name == "" {
			return
		}
		if seen[kind+" "+name] {
			t.Errorf("%s %q is in the table twice", kind, name)
		}
		seen[kind+" "+name] = true
	}
	for _, m := range api.GPUMetrics {
		once("name", m.Name)
		once("column", m.Column)
		if m.Prom != nil {
			once("family", m.Prom.Name)
		}
		if m.DCGM != nil {
			once("family", m.DCGM.Name)
			once("dcgm position", fmt.Sprint(m.DCGM.Seq))
		}
		if (m.Name == "") != (m.Field == nil) {
			t.Errorf("%q/%q: a named metric has a record field and only it", m.Name, m.NVML)
			continue
		}
		if m.Column != "" && m.Column != m.Name {
			t.Errorf("%s is stored in column %s: the query API names columns", m.Name, m.Column)
		}
		if m.NVML != "" && m.Field != nil && m.NVMLScale == 0 {
			t.Errorf("%s: read from NVML's %s without a scale", m.Name, m.NVML)
		}
		if m.Field == nil {
			continue
		}
		off := reflect.ValueOf(m.Field(&g)).Pointer() - base
		if tags[off] != m.Name {
			t.Errorf("metric %s reads the record's field %q", m.Name, tags[off])
		}
		inTable[tags[off]] = true
		// Set and Value go through the same field.
		var r api.GPU
		m.Set(&r, 42)
		switch v := m.Value(&r).(type) {
		case float64:
			if v != 42 {
				t.Errorf("%s: set 42, read %v", m.Name, v)
			}
		case int64:
			if v != 42 {
				t.Errorf("%s: set 42, read %v", m.Name, v)
			}
		default:
			t.Errorf("%s: set 42, read %#v", m.Name, v)
		}
	}
	floatPtr, intPtr := reflect.TypeOf((*api.Float)(nil)), reflect.TypeOf((*int64)(nil))
	for i := 0; i < typ.NumField(); i++ {
		f := typ.Field(i)
		name := strings.Split(f.Tag.Get("json"), ",")[0]
		if (f.Type == floatPtr || (f.Type == intPtr && name != "rank")) && !inTable[name] {
			t.Errorf("the record's %s is not in api.GPUMetrics", name)
		}
	}
}

const (
	docsPath  = "../docs/metrics.md"
	docsBegin = "<!-- gpu-metrics: generated from api.GPUMetrics by `go test ./api -run TestDocsListGPUMetrics -update` -->\n"
	docsEnd   = "<!-- end gpu-metrics -->\n"
)

// gpuDocsTable is docs/metrics.md's table of the GPU values.
func gpuDocsTable() string {
	var b strings.Builder
	b.WriteString("| record field, column | unit | family (type) | dcgm-exporter family | what |\n| --- | --- | --- | --- | --- |\n")
	code := func(s string) string {
		if s == "" {
			return ""
		}
		return "`" + s + "`"
	}
	for _, m := range api.GPUMetrics {
		field := code(m.Name)
		if m.Name != "" && m.Column == "" {
			field += " (not stored)"
		}
		var fam, dcgm string
		what := m.Label
		if m.DCGM != nil {
			dcgm = fmt.Sprintf("`%s` (%s)", m.DCGM.Name, m.DCGM.Type)
			what = m.DCGM.Help
		}
		if m.Prom != nil {
			fam = fmt.Sprintf("`%s` (%s)", m.Prom.Name, m.Prom.Type)
			what = m.Prom.Help
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", field, m.Unit, fam, dcgm, what)
	}
	return b.String()
}

// docs/metrics.md lists every GPU value as the table defines it.
func TestDocsListGPUMetrics(t *testing.T) {
	doc, err := os.ReadFile(docsPath)
	if err != nil {
		t.Fatal(err)
	}
	s := string(doc)
	i, j := strings.Index(s, docsBegin), strings.Index(s, docsEnd)
	if i < 0 || j < i {
		t.Fatalf("%s has no generated GPU table between %q and %q", docsPath, docsBegin, docsEnd)
	}
	want := s[:i+len(docsBegin)] + gpuDocsTable() + s[j:]
	if *update {
		if err := os.WriteFile(docsPath, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if s != want {
		t.Errorf("%s's GPU table differs from api.GPUMetrics; run go test ./api -run TestDocsListGPUMetrics -update", docsPath)
	}
}
