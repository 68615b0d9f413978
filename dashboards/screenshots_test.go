package dashboards_test

import (
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/deepseed/deepseed/dashboards"
)

// screenshotDir holds the dashboards as a real Grafana drew them, and
// manifest.json what each page showed (testdata/screenshots/README.md).
var screenshotDir = filepath.Join("testdata", "screenshots")

type screenshotManifest struct {
	Grafana string `json:"grafana"`
	Shots   []struct {
		Name      string   `json:"name"`
		Dashboard string   `json:"dashboard"`
		Path      string   `json:"path"`
		Width     int      `json:"width"`
		Height    int      `json:"height"`
		Panels    []string `json:"panels"`
	} `json:"shots"`
}

// TestScreenshotsShowTheProvisionedPanels keeps the committed screenshots
// honest: each is a 1,600-px-wide PNG of a provisioned dashboard whose
// panels, as the page listed them when it was taken, are the panels the
// dashboard's JSON has now (a title with a variable matches what Grafana
// wrote for it). A panel added, removed or renamed since fails here until
// the screenshots are taken again; every dashboard has at least one.
func TestScreenshotsShowTheProvisionedPanels(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(screenshotDir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m screenshotManifest
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("manifest.json: %v", err)
	}
	if !strings.HasPrefix(m.Grafana, "12.") {
		t.Errorf("taken in Grafana %q, want 12.x", m.Grafana)
	}
	shot := map[string]bool{}
	for _, s := range m.Shots {
		shot[s.Dashboard] = true
		t.Run(s.Name, func(t *testing.T) {
			f, err := os.Open(filepath.Join(screenshotDir, s.Name+".png"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			cfg, err := png.DecodeConfig(f)
			if err != nil {
				t.Fatalf("%s.png: %v", s.Name, err)
			}
			if cfg.Width != 1600 || cfg.Width != s.Width || cfg.Height != s.Height {
				t.Errorf("%s.png is %d x %d, the manifest says %d x %d, want 1600 wide", s.Name, cfg.Width, cfg.Height, s.Width, s.Height)
			}
			if !strings.HasPrefix(s.Path, "/d/"+s.Dashboard+"?") {
				t.Errorf("path %q is not of dashboard %s", s.Path, s.Dashboard)
			}
			var want []string
			for _, p := range rawPanels(t, s.Dashboard) {
				if p.str("type") != "row" {
					want = append(want, p.str("title"))
				}
			}
			for _, w := range want {
				if !slices.ContainsFunc(s.Panels, func(seen string) bool { return titleMatches(w, seen) }) {
					t.Errorf("panel %q of the dashboard is not in the screenshot: take it again", w)
				}
			}
			for _, seen := range s.Panels {
				if !slices.ContainsFunc(want, func(w string) bool { return titleMatches(w, seen) }) {
					t.Errorf("the screenshot shows %q, which the dashboard no longer has: take it again", seen)
				}
			}
		})
	}
	for _, d := range dashboards.All() {
		if !shot[d.UID] {
			t.Errorf("no screenshot of %s", d.UID)
		}
	}
}

// titleMatches reports whether Grafana could have drawn title (which may
// hold $var or ${var}) as seen: an empty variable leaves two spaces, which
// the page shows as one.
func titleMatches(title, seen string) bool {
	parts := regexp.MustCompile(`\$\{?[A-Za-z_][A-Za-z0-9_]*\}?`).Split(title, -1)
	for i, p := range parts {
		parts[i] = strings.ReplaceAll(regexp.QuoteMeta(p), " ", `\s*`)
	}
	return regexp.MustCompile("^" + strings.Join(parts, ".*") + "$").MatchString(seen)
}
