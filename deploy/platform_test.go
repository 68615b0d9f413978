package deploy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// platformArgs are the build arguments BuildKit sets itself for every
// build ("automatic platform ARGs"). A stage uses one by declaring it
// with ARG and no value: a value there would replace BuildKit's, and an
// arm64 build would then produce amd64 executables.
var platformArgs = regexp.MustCompile(`^(TARGET|BUILD)(PLATFORM|OS|ARCH|VARIANT)$`)

// dockerfileLines returns the instructions of a Dockerfile, continuation
// lines joined, comments dropped.
func dockerfileLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	cur := ""
	for _, l := range strings.Split(string(b), "\n") {
		if s := strings.TrimSpace(l); strings.HasPrefix(s, "#") {
			continue
		}
		cur += strings.TrimSpace(strings.TrimSuffix(l, "\\")) + " "
		if !strings.HasSuffix(strings.TrimRight(l, " \t"), "\\") {
			if s := strings.TrimSpace(cur); s != "" {
				out = append(out, s)
			}
			cur = ""
		}
	}
	return out
}

// Every image builds for the platform asked of BuildKit: no platform
// argument has a default, a stage that runs on the build machine's
// platform (FROM --platform=$BUILDPLATFORM) builds nothing with cgo, and
// the plugin's executable is named for the target as plugin.json and
// Grafana expect.
func TestImagesBuildForTheTargetPlatform(t *testing.T) {
	for _, df := range []string{"Dockerfile", filepath.Join("grafana", "Dockerfile")} {
		lines := dockerfileLines(t, filepath.Join(root, df))
		if b, _ := os.ReadFile(filepath.Join(root, df)); !strings.HasPrefix(string(b), "# syntax=docker/dockerfile:1") {
			t.Errorf("%s: first line is not # syntax=docker/dockerfile:1 (BuildKit's frontend, which sets the platform arguments)", df)
		}
		onBuildPlatform := false
		for _, l := range lines {
			f := strings.Fields(l)
			switch strings.ToUpper(f[0]) {
			case "FROM":
				onBuildPlatform = len(f) > 1 && f[1] == "--platform=$BUILDPLATFORM"
				if len(f) > 1 && strings.HasPrefix(f[1], "--platform=") && !onBuildPlatform {
					t.Errorf("%s: %q fixes a stage's platform", df, l)
				}
			case "ARG":
				for _, a := range f[1:] {
					name, _, hasValue := strings.Cut(a, "=")
					if platformArgs.MatchString(name) && hasValue {
						t.Errorf("%s: %q gives the platform argument %s a value, which replaces the one BuildKit sets", df, l, name)
					}
				}
			case "RUN":
				if onBuildPlatform && strings.Contains(l, "CGO_ENABLED=1") {
					t.Errorf("%s: a stage on the build machine's platform builds with cgo, for the wrong platform: %q", df, l)
				}
			}
		}
	}

	var manifest struct {
		Backend    bool   `json:"backend"`
		Executable string `json:"executable"`
	}
	b, err := os.ReadFile(filepath.Join(root, "grafana-plugin", "src", "plugin.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &manifest); err != nil {
		t.Fatal(err)
	}
	if !manifest.Backend || manifest.Executable == "" || strings.Contains(manifest.Executable, "_linux") {
		t.Fatalf("plugin.json: backend %v, executable %q; want the executable's base name, Grafana adds _<os>_<arch>", manifest.Backend, manifest.Executable)
	}
	grafana := strings.Join(dockerfileLines(t, filepath.Join(root, "grafana", "Dockerfile")), "\n")
	if want := "-o /out/" + manifest.Executable + "_${TARGETOS}_${TARGETARCH} ./grafana-plugin/pkg"; !strings.Contains(grafana, want) {
		t.Errorf("grafana/Dockerfile does not build %s for the target platform (want %q)", manifest.Executable, want)
	}
	script, err := os.ReadFile(filepath.Join(root, "grafana-plugin", "build-backend.sh"))
	if err != nil {
		t.Fatal(err)
	}
	for _, arch := range []string{"amd64", "arm64"} {
		if !strings.Contains(string(script), arch) || !strings.Contains(string(script), manifest.Executable+"_linux_$arch") {
			t.Errorf("build-backend.sh does not build %s_linux_%s", manifest.Executable, arch)
		}
	}
}
