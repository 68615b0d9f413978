package deploy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The repository's LICENSE is the license its packages declare.
func TestLicenseMatchesPackages(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "LICENSE"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	if !strings.Contains(text, "Apache License") || !strings.Contains(text, "Version 2.0, January 2004") ||
		!strings.Contains(text, "END OF TERMS AND CONDITIONS") {
		t.Error("LICENSE is not the full Apache License 2.0")
	}
	py, err := os.ReadFile(filepath.Join(root, "hook", "pyproject.toml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(py), `license = { text = "Apache-2.0" }`) {
		t.Error("hook/pyproject.toml does not declare Apache-2.0")
	}
	var pkg struct {
		License string `json:"license"`
	}
	js, err := os.ReadFile(filepath.Join(root, "grafana-plugin", "package.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(js, &pkg); err != nil || pkg.License != "Apache-2.0" {
		t.Errorf("grafana-plugin/package.json license %q (%v), want Apache-2.0", pkg.License, err)
	}
}
