package dashboards_test

import (
	"os"
	"path/filepath"
	"testing"

	"go.yaml.in/yaml/v4"

	"github.com/deepseed/deepseed/dashboards"
)

// DatasourceProvisioning is Grafana's data source provisioning file.
type DatasourceProvisioning struct {
	APIVersion  int `yaml:"apiVersion"`
	Datasources []struct {
		Name           string            `yaml:"name"`
		Type           string            `yaml:"type"`
		UID            string            `yaml:"uid"`
		Access         string            `yaml:"access"`
		IsDefault      bool              `yaml:"isDefault"`
		JSONData       map[string]any    `yaml:"jsonData"`
		SecureJSONData map[string]string `yaml:"secureJsonData"`
	} `yaml:"datasources"`
}

// DashboardProvisioning is Grafana's dashboard provider file.
type DashboardProvisioning struct {
	APIVersion int `yaml:"apiVersion"`
	Providers  []struct {
		Name    string `yaml:"name"`
		Type    string `yaml:"type"`
		Folder  string `yaml:"folder"`
		Options struct {
			Path string `yaml:"path"`
		} `yaml:"options"`
	} `yaml:"providers"`
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// TestDatasourceProvisioning checks that the provisioned data source is
// the one every dashboard names, with the server URL and the read token
// from the environment.
func TestDatasourceProvisioning(t *testing.T) {
	var p DatasourceProvisioning
	readYAML(t, filepath.Join("provisioning", "datasources", "deepseed.yaml"), &p)
	if p.APIVersion != 1 || len(p.Datasources) != 1 {
		t.Fatalf("apiVersion %d with %d data sources, want 1 and 1", p.APIVersion, len(p.Datasources))
	}
	ds := p.Datasources[0]
	if ds.UID != dashboards.DatasourceUID || ds.Type != dashboards.PluginID {
		t.Errorf("data source uid %q type %q, want %q %q", ds.UID, ds.Type, dashboards.DatasourceUID, dashboards.PluginID)
	}
	if ds.JSONData["url"] != "http://deepseed:8080" {
		t.Errorf("jsonData.url %v, want the compose service http://deepseed:8080", ds.JSONData["url"])
	}
	if ds.SecureJSONData["token"] != "${DEEPSEED_READ_TOKEN}" {
		t.Errorf("secureJsonData.token %q, want ${DEEPSEED_READ_TOKEN}", ds.SecureJSONData["token"])
	}
	uids := map[string]bool{"grafana": true, "-- Grafana --": true}
	for _, d := range p.Datasources {
		uids[d.UID] = true
	}
	for uid, d := range loadDashboards(t) {
		for _, panel := range d.Panels {
			if panel.Datasource != nil && !uids[panel.Datasource.UID] {
				t.Errorf("%s: panel %q uses data source %q, which is not provisioned", uid, panel.Title, panel.Datasource.UID)
			}
		}
		for _, v := range d.Templating.List {
			if v.Datasource != nil && !uids[v.Datasource.UID] {
				t.Errorf("%s: variable %s uses data source %q, which is not provisioned", uid, v.Name, v.Datasource.UID)
			}
		}
		for _, a := range d.Annotations.List {
			if !uids[a.Datasource.UID] {
				t.Errorf("%s: annotation %q uses data source %q, which is not provisioned", uid, a.Name, a.Datasource.UID)
			}
		}
	}
}

// TestDashboardProvisioning checks the dashboard provider reads a folder;
// the compose test checks that the folder is where dashboards/json is
// mounted.
func TestDashboardProvisioning(t *testing.T) {
	var p DashboardProvisioning
	readYAML(t, filepath.Join("provisioning", "dashboards", "deepseed.yaml"), &p)
	if p.APIVersion != 1 || len(p.Providers) != 1 {
		t.Fatalf("apiVersion %d with %d providers, want 1 and 1", p.APIVersion, len(p.Providers))
	}
	if pr := p.Providers[0]; pr.Type != "file" || !filepath.IsAbs(pr.Options.Path) {
		t.Errorf("provider type %q path %q, want a file provider with an absolute path", pr.Type, pr.Options.Path)
	}
}
