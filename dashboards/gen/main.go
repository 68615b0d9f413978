// Command gen writes DeepSeed's provisioned dashboards as JSON.
//
//	go run ./dashboards/gen            # writes dashboards/json/*.json
//	go run ./dashboards/gen -out DIR
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
	flag.Parse()
	if err := run(*out); err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}

func run(dir string) error {
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
	return nil
}
