package localpg

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// timescaleOptions returns the server options that preload TimescaleDB
// when the PostgreSQL installation of lp.bin has it (unless
// WithoutTimescale), then lp.Settings, which win. Telemetry is turned
// off: the private cluster never calls out.
func (lp *Cluster) timescaleOptions(log *slog.Logger) string {
	var opts string
	if !lp.WithoutTimescale {
		if lib, ok := TimescaleInstalled(lp.bin); ok {
			log.Info("TimescaleDB found; preloading it in the private PostgreSQL", "library", lib)
			// PostgreSQL's default of 8 worker processes leaves too few
			// for TimescaleDB's launcher, scheduler and jobs beside the
			// parallel query workers ("failed to launch job … failed to
			// start a background worker"): add the 16 that TimescaleDB's
			// timescaledb.max_background_workers allows by default.
			opts += " -c shared_preload_libraries=timescaledb -c timescaledb.telemetry_level=off -c max_worker_processes=24"
		}
	}
	names := make([]string, 0, len(lp.Settings))
	for k := range lp.Settings {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		opts += fmt.Sprintf(" -c %s=%s", k, lp.Settings[k])
	}
	return opts
}

// TimescaleInstalled reports whether the PostgreSQL installation whose
// server binaries are in bin has the timescaledb extension: its library
// in the package library directory and its control file in the share
// directory's extension/. It returns the library's path.
func TimescaleInstalled(bin string) (string, bool) {
	libDirs, shareDirs := pgDirs(bin)
	var lib string
	for _, d := range libDirs {
		if p := filepath.Join(d, "timescaledb.so"); fileExists(p) {
			lib = p
			break
		}
	}
	if lib == "" {
		return "", false
	}
	for _, d := range shareDirs {
		if fileExists(filepath.Join(d, "extension", "timescaledb.control")) {
			return lib, true
		}
	}
	return "", false
}

// pgDirs returns the candidate package library and share directories of
// the installation in bin: what its own pg_config says, else the usual
// layouts (bin/../lib, bin/../lib/postgresql; bin/../share,
// bin/../share/postgresql, and Debian's /usr/share/postgresql/MAJOR).
func pgDirs(bin string) (libs, shares []string) {
	if pgc := filepath.Join(bin, "pg_config"); isExec(pgc) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, err := exec.CommandContext(ctx, pgc, "--pkglibdir", "--sharedir").Output()
		cancel()
		if lines := strings.Split(strings.TrimSpace(string(out)), "\n"); err == nil && len(lines) == 2 {
			libs = append(libs, strings.TrimSpace(lines[0]))
			shares = append(shares, strings.TrimSpace(lines[1]))
		}
	}
	root := filepath.Dir(bin)
	libs = append(libs, filepath.Join(root, "lib"), filepath.Join(root, "lib", "postgresql"))
	shares = append(shares, filepath.Join(root, "share"), filepath.Join(root, "share", "postgresql"))
	// Debian: /usr/lib/postgresql/15/bin shares /usr/share/postgresql/15.
	if major := filepath.Base(root); filepath.Base(filepath.Dir(root)) == "postgresql" {
		shares = append(shares, filepath.Join("/usr/share/postgresql", major))
	}
	return libs, shares
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}
