package detect_test

import (
	"os/exec"
	"strings"
	"testing"
)

// deps lists the packages of this module that the packages of pattern
// link, as go list -deps reports them (tests excluded).
func deps(t *testing.T, pattern string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", pattern).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pattern, err)
	}
	return strings.Fields(string(out))
}

// TestDetectIsALeaf holds the package map's arrows: the detectors link
// only api and internal/stats, and the dashboards link the detectors'
// table but neither the evaluator nor the plugin (and so not the
// plugin SDK).
func TestDetectIsALeaf(t *testing.T) {
	const mod = "github.com/deepseed/deepseed/"
	allowed := map[string]bool{mod + "detect": true, mod + "api": true, mod + "internal/stats": true}
	for _, p := range deps(t, ".") {
		if !allowed[p] {
			t.Errorf("detect links %s; it may link only api and internal/stats", p)
		}
	}
	var sawDetect bool
	for _, p := range deps(t, "../dashboards/...") {
		sawDetect = sawDetect || p == mod+"detect"
		if strings.HasPrefix(p, mod+"alerts") || strings.HasPrefix(p, mod+"grafana-plugin") ||
			strings.HasPrefix(p, "github.com/grafana/grafana-plugin-sdk-go") || strings.HasPrefix(p, mod+"store") {
			t.Errorf("the dashboards link %s", p)
		}
	}
	if !sawDetect {
		t.Error("the dashboards no longer link detect: the dependency list read is not the dashboards'")
	}
}
