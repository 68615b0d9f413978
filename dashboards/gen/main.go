// Command gen writes DeepSeed's provisioned dashboards as JSON and the
// Grafana alert rules of the server's detectors as alerting provisioning.
//
//	go run ./dashboards/gen            # writes dashboards/json/*.json and grafana/provisioning/alerting/deepseed.yaml
//	go run ./dashboards/gen -out DIR -alerting FILE
//
// Run it from the repository root.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/deepseed/deepseed/dashboards"
)

func main() {
	out := flag.String("out", filepath.Join("dashboards", "json"), "directory to write the dashboard JSON files to")
	alerting := flag.String("alerting", filepath.FromSlash(dashboards.AlertRulesFile), "file to write the Grafana alert rules to")
	flag.Parse()
	if err := run(*out, *alerting); err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}

func run(dir, alerting string) error {
	files, err := dashboards.RenderAll()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	for name, b := range files {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, b, 0o644); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
		fmt.Println("wrote", path)
	}
	rules, err := dashboards.RenderAlerting()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(alerting), 0o755); err != nil {
		return fmt.Errorf("create %s: %w", filepath.Dir(alerting), err)
	}
	if err := os.WriteFile(alerting, rules, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", alerting, err)
	}
	fmt.Println("wrote", alerting)
	return nil
}
