package deploy

import (
	"bufio"
	"context"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"go.yaml.in/yaml/v4"

	"github.com/deepseed/deepseed/server"
)

// root is the repository root, where docker-compose.yml and .env live.
const root = ".."

// loadProject loads docker-compose.yml with .env as Docker Compose does,
// with the given profiles enabled. The process environment is left out so
// the test sees the defaults a fresh checkout gets.
func loadProject(t *testing.T, profiles ...string) *types.Project {
	t.Helper()
	opts, err := cli.NewProjectOptions(
		[]string{filepath.Join(root, "docker-compose.yml")},
		cli.WithWorkingDirectory(root),
		cli.WithEnvFiles(filepath.Join(root, ".env")),
		cli.WithDotEnv,
		cli.WithProfiles(profiles),
		cli.WithConsistency(true),
		cli.WithResolvedPaths(true),
	)
	if err != nil {
		t.Fatal(err)
	}
	p, err := cli.ProjectFromOptions(context.Background(), opts)
	if err != nil {
		t.Fatalf("load docker-compose.yml: %v", err)
	}
	return p
}

func service(t *testing.T, p *types.Project, name string) types.ServiceConfig {
	t.Helper()
	s, err := p.GetService(name)
	if err != nil {
		t.Fatalf("service %s: %v", name, err)
	}
	return s
}

func env(s types.ServiceConfig, key string) string {
	if v, ok := s.Environment[key]; ok && v != nil {
		return *v
	}
	return ""
}

// dotEnv reads the .env file.
func dotEnv(t *testing.T) map[string]string {
	t.Helper()
	f, err := os.Open(filepath.Join(root, ".env"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := make(map[string]string)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf(".env: bad line %q", line)
		}
		out[k] = v
	}
	return out
}

func TestComposeServices(t *testing.T) {
	p := loadProject(t)
	want := []string{"deepseed", "demo", "grafana", "timescaledb"}
	got := p.ServiceNames()
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("default services %v, want %v (collector only with --profile gpu)", got, want)
	}
	if _, ok := p.DisabledServices["collector"]; !ok {
		t.Errorf("collector should be disabled without the gpu profile")
	}
}

// TestBuildContexts checks every build context and Dockerfile exists, and
// every file a Dockerfile copies from the context is there.
func TestBuildContexts(t *testing.T) {
	p := loadProject(t, "gpu")
	built := make(map[string]bool)
	for _, s := range p.Services {
		if s.Build == nil {
			continue
		}
		built[s.Image] = true
		if fi, err := os.Stat(s.Build.Context); err != nil || !fi.IsDir() {
			t.Errorf("%s: build context %s: %v", s.Name, s.Build.Context, err)
			continue
		}
		df := s.Build.Dockerfile
		if !filepath.IsAbs(df) {
			df = filepath.Join(s.Build.Context, df)
		}
		for _, src := range copySources(t, df) {
			if _, err := os.Stat(filepath.Join(s.Build.Context, src)); err != nil {
				t.Errorf("%s: %s copies %s, which is missing from the context: %v", s.Name, df, src, err)
			}
		}
	}
	// Services that reuse an image must reuse one this file builds, or a
	// pinned public one.
	for _, s := range p.AllServices() {
		if s.Build != nil {
			continue
		}
		if strings.HasSuffix(s.Image, ":local") && !built[s.Image] {
			t.Errorf("%s: image %s is built by no service", s.Name, s.Image)
		}
		if !strings.HasSuffix(s.Image, ":local") && (!strings.Contains(s.Image, ":") || strings.Contains(s.Image, "latest")) {
			t.Errorf("%s: image %s is not pinned", s.Name, s.Image)
		}
	}
	if ts := service(t, p, "timescaledb"); !strings.HasPrefix(ts.Image, "timescale/timescaledb:") || !strings.HasSuffix(ts.Image, "-pg16") {
		t.Errorf("timescaledb image %s, want the official timescale/timescaledb:<version>-pg16", ts.Image)
	}
}

// copySources returns the context paths a Dockerfile's COPY and ADD read
// (not those copied from other stages).
func copySources(t *testing.T, dockerfile string) []string {
	t.Helper()
	b, err := os.ReadFile(dockerfile)
	if err != nil {
		t.Fatalf("Dockerfile: %v", err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 3 || (fields[0] != "COPY" && fields[0] != "ADD") {
			continue
		}
		args := fields[1:]
		fromStage := false
		for len(args) > 0 && strings.HasPrefix(args[0], "--") {
			if strings.HasPrefix(args[0], "--from=") {
				fromStage = true
			}
			args = args[1:]
		}
		if fromStage || len(args) < 2 {
			continue
		}
		out = append(out, args[:len(args)-1]...)
	}
	if len(out) == 0 {
		t.Errorf("%s copies nothing from its context", dockerfile)
	}
	return out
}

func TestGrafanaImagePinned(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "grafana", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	if !strings.Contains(s, "FROM grafana/grafana:${GRAFANA_VERSION}") || !strings.Contains(s, "ARG GRAFANA_VERSION=1") {
		t.Errorf("grafana/Dockerfile must build FROM the official grafana/grafana image at a pinned version")
	}
	if !strings.Contains(s, "/var/lib/grafana/plugins/deepseed-telemetry-datasource") {
		t.Errorf("grafana/Dockerfile must install the plugin into /var/lib/grafana/plugins/deepseed-telemetry-datasource")
	}
	if !strings.Contains(s, "npm ci") || !strings.Contains(s, "./grafana-plugin/pkg") {
		t.Errorf("grafana/Dockerfile must build the frontend with npm ci and the backend from ./grafana-plugin/pkg")
	}
}

// TestMounts checks every bind mount's host path exists and every named
// volume is declared.
func TestMounts(t *testing.T) {
	p := loadProject(t, "gpu")
	for _, s := range p.Services {
		for _, v := range s.Volumes {
			switch v.Type {
			case types.VolumeTypeBind:
				if _, err := os.Stat(v.Source); err != nil {
					t.Errorf("%s: mounts %s, which does not exist: %v", s.Name, v.Source, err)
				}
				if !v.ReadOnly {
					t.Errorf("%s: bind mount %s should be read-only", s.Name, v.Target)
				}
			case types.VolumeTypeVolume:
				if _, ok := p.Volumes[v.Source]; !ok {
					t.Errorf("%s: volume %s is not declared", s.Name, v.Source)
				}
			}
		}
	}
	ts := service(t, p, "timescaledb")
	if !slices.ContainsFunc(ts.Volumes, func(v types.ServiceVolumeConfig) bool {
		return v.Type == types.VolumeTypeVolume && v.Target == "/var/lib/postgresql/data"
	}) {
		t.Errorf("timescaledb: the database needs a named volume on /var/lib/postgresql/data")
	}
}

// TestPorts checks published ports are distinct and reach the port each
// service listens on.
func TestPorts(t *testing.T) {
	p := loadProject(t, "gpu")
	published := make(map[string]string)
	for _, s := range p.Services {
		for _, port := range s.Ports {
			if other, ok := published[port.Published]; ok {
				t.Errorf("%s and %s both publish port %s", s.Name, other, port.Published)
			}
			published[port.Published] = s.Name
		}
	}
	listen := map[string]uint32{"deepseed": 8080, "grafana": 3000}
	for name, want := range listen {
		s := service(t, p, name)
		if len(s.Ports) != 1 || s.Ports[0].Target != want {
			t.Errorf("%s: ports %+v, want one publishing container port %d", name, s.Ports, want)
		}
	}
	if got := env(service(t, p, "deepseed"), "DEEPSEED_LISTEN"); got != ":8080" {
		t.Errorf("deepseed: DEEPSEED_LISTEN %q, want :8080 (the published port)", got)
	}
	if _, ok := published["3000"]; !ok {
		t.Errorf("Grafana is not on http://localhost:3000 with the default .env")
	}
}

// TestStartOrder checks healthchecks and the depends_on conditions that
// make "docker compose up" start each service once what it needs is
// ready.
func TestStartOrder(t *testing.T) {
	p := loadProject(t, "gpu")
	for _, name := range []string{"timescaledb", "deepseed", "grafana"} {
		s := service(t, p, name)
		if s.HealthCheck == nil || len(s.HealthCheck.Test) == 0 || s.HealthCheck.Disable {
			t.Errorf("%s: no healthcheck", name)
		}
	}
	if hc := service(t, p, "timescaledb").HealthCheck; hc != nil && !strings.Contains(strings.Join(hc.Test, " "), "pg_isready") {
		t.Errorf("timescaledb: healthcheck %v, want pg_isready", hc.Test)
	}
	if hc := service(t, p, "deepseed").HealthCheck; hc != nil && !strings.Contains(strings.Join(hc.Test, " "), "/readyz") {
		t.Errorf("deepseed: healthcheck %v, want /readyz", hc.Test)
	}
	want := map[string]map[string]string{
		"deepseed":  {"timescaledb": types.ServiceConditionHealthy},
		"demo":      {"deepseed": types.ServiceConditionHealthy},
		"grafana":   {"deepseed": types.ServiceConditionHealthy},
		"collector": {"deepseed": types.ServiceConditionHealthy},
	}
	for name, deps := range want {
		s := service(t, p, name)
		for dep, cond := range deps {
			if got := s.DependsOn[dep].Condition; got != cond {
				t.Errorf("%s: depends_on %s condition %q, want %q", name, dep, got, cond)
			}
		}
	}
	for _, s := range p.Services {
		for dep, d := range s.DependsOn {
			if d.Condition == types.ServiceConditionHealthy && service(t, p, dep).HealthCheck == nil {
				t.Errorf("%s waits for %s to be healthy, which has no healthcheck", s.Name, dep)
			}
		}
	}
	if demo := service(t, p, "demo"); demo.Restart != "no" {
		t.Errorf("demo: restart %q, want \"no\" (one shot)", demo.Restart)
	}
}

// TestCommands checks each service runs the deepseed subcommand it should,
// against the right addresses.
func TestCommands(t *testing.T) {
	p := loadProject(t, "gpu")
	if c := service(t, p, "deepseed").Command; len(c) == 0 || c[0] != "serve" {
		t.Errorf("deepseed: command %v, want serve", c)
	}
	demo := service(t, p, "demo")
	if got := strings.Join(demo.Command, " "); got != "demo --server http://deepseed:8080" {
		t.Errorf("demo: command %q", got)
	}
	col := service(t, p, "collector")
	cmd := strings.Join(col.Command, " ")
	if !strings.HasPrefix(cmd, "collect ") || !strings.Contains(cmd, "--server http://127.0.0.1:8080") {
		t.Errorf("collector: command %q, want collect against the server published on this host", cmd)
	}
	if col.NetworkMode != "host" {
		t.Errorf("collector: network_mode %q; the hook on the host must reach it on 127.0.0.1", col.NetworkMode)
	}
	dbURL, err := url.Parse(env(service(t, p, "deepseed"), "DEEPSEED_DATABASE_URL"))
	if err != nil {
		t.Fatal(err)
	}
	ts := service(t, p, "timescaledb")
	pw, _ := dbURL.User.Password()
	if dbURL.Host != "timescaledb:5432" || dbURL.User.Username() != env(ts, "POSTGRES_USER") ||
		pw != env(ts, "POSTGRES_PASSWORD") || strings.TrimPrefix(dbURL.Path, "/") != env(ts, "POSTGRES_DB") {
		t.Errorf("deepseed: DEEPSEED_DATABASE_URL %s does not match the timescaledb service", dbURL.Redacted())
	}
}

// TestCollectorSpoolOnItsVolume checks the collector spools to the named
// volume mounted for it, whatever the binary's default for its user, and
// that the image itself points the spool there and creates the directory
// for its unprivileged user.
func TestCollectorSpoolOnItsVolume(t *testing.T) {
	p := loadProject(t, "gpu")
	col := service(t, p, "collector")
	cmd := strings.Join(col.Command, " ")
	const spool = "/var/lib/deepseed/spool"
	if !strings.Contains(cmd, "--spool-dir "+spool) {
		t.Errorf("collector: command %q does not name --spool-dir %s", cmd, spool)
	}
	if !slices.ContainsFunc(col.Volumes, func(v types.ServiceVolumeConfig) bool {
		return v.Type == types.VolumeTypeVolume && v.Target == spool
	}) {
		t.Errorf("collector: no named volume on %s", spool)
	}
	b, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	df := string(b)
	if !strings.Contains(df, "DEEPSEED_SPOOL_DIR="+spool) || !strings.Contains(df, "install -d -o deepseed -g deepseed /var/lib/deepseed/data "+spool) {
		t.Errorf("Dockerfile: want DEEPSEED_SPOOL_DIR=%s and the directory created for the deepseed user", spool)
	}
}

// TestGPUProfile checks the collector is under the gpu profile with an
// NVIDIA device reservation.
func TestGPUProfile(t *testing.T) {
	p := loadProject(t, "gpu")
	col := service(t, p, "collector")
	if !slices.Equal(col.Profiles, []string{"gpu"}) {
		t.Errorf("collector: profiles %v, want [gpu]", col.Profiles)
	}
	if col.Deploy == nil || col.Deploy.Resources.Reservations == nil || len(col.Deploy.Resources.Reservations.Devices) != 1 {
		t.Fatalf("collector: no device reservation")
	}
	d := col.Deploy.Resources.Reservations.Devices[0]
	if d.Driver != "nvidia" || d.Count != -1 || !slices.Contains(d.Capabilities, "gpu") {
		t.Errorf("collector: device reservation %+v, want driver nvidia, count all, capabilities [gpu]", d)
	}
}

// TestTokens checks the tokens of .env reach every service consistently:
// the server accepts what the loader, collector and Grafana send.
func TestTokens(t *testing.T) {
	dot := dotEnv(t)
	ingest, read := dot["DEEPSEED_INGEST_TOKEN"], dot["DEEPSEED_READ_TOKEN"]
	if ingest == "" || read == "" || ingest == read {
		t.Fatalf(".env: DEEPSEED_INGEST_TOKEN %q and DEEPSEED_READ_TOKEN %q must be set and differ", ingest, read)
	}
	p := loadProject(t, "gpu")
	srv := service(t, p, "deepseed")
	if got := env(srv, "DEEPSEED_INGEST_TOKENS"); got != ingest {
		t.Errorf("deepseed: DEEPSEED_INGEST_TOKENS %q, want .env's ingest token", got)
	}
	if got := env(srv, "DEEPSEED_READ_TOKENS"); got != read {
		t.Errorf("deepseed: DEEPSEED_READ_TOKENS %q, want .env's read token", got)
	}
	for _, v := range []string{"SUBMIT", "AGENT"} {
		tok := dot["DEEPSEED_"+v+"_TOKEN"]
		if tok == "" || tok == ingest || tok == read {
			t.Errorf(".env: DEEPSEED_%s_TOKEN %q must be set and differ from the ingest and read tokens", v, tok)
		}
		got := env(srv, "DEEPSEED_"+v+"_TOKENS")
		if v == "AGENT" {
			// An agent token names the agents it may act as.
			name, _, token, err := server.ParseAgentToken(got)
			if err != nil || name == "" || token != tok {
				t.Errorf("deepseed: DEEPSEED_AGENT_TOKENS %q (%v), want NAME:<.env's agent token>", got, err)
			}
			continue
		}
		if got != tok {
			t.Errorf("deepseed: DEEPSEED_%s_TOKENS %q, want .env's token", v, got)
		}
	}
	for _, name := range []string{"demo", "collector"} {
		if got := env(service(t, p, name), "DEEPSEED_TOKEN"); got != ingest {
			t.Errorf("%s: DEEPSEED_TOKEN %q, want the ingest token", name, got)
		}
	}
	if got := env(service(t, p, "grafana"), "DEEPSEED_READ_TOKEN"); got != read {
		t.Errorf("grafana: DEEPSEED_READ_TOKEN %q, want the read token the data source provisioning reads", got)
	}
}

// TestGrafanaProvisioning checks Grafana's settings and mounts against the
// provisioning files: the provider reads where the dashboards are
// mounted, the home dashboard is one of them, the data source points at
// the deepseed service.
func TestGrafanaProvisioning(t *testing.T) {
	p := loadProject(t)
	g := service(t, p, "grafana")
	for k, want := range map[string]string{
		"GF_PLUGINS_ALLOW_LOADING_UNSIGNED_PLUGINS": "deepseed-telemetry-datasource",
		"GF_AUTH_ANONYMOUS_ENABLED":                 "true",
		"GF_AUTH_ANONYMOUS_ORG_ROLE":                "Viewer",
	} {
		if got := env(g, k); got != want {
			t.Errorf("grafana: %s=%q, want %q", k, got, want)
		}
	}
	mounts := make(map[string]string) // container path -> host path
	for _, v := range g.Volumes {
		mounts[v.Target] = v.Source
	}
	dashDir := filepath.Join(root, "dashboards")
	for target, src := range map[string]string{
		"/etc/grafana/provisioning/datasources": filepath.Join(dashDir, "provisioning", "datasources"),
		"/etc/grafana/provisioning/dashboards":  filepath.Join(dashDir, "provisioning", "dashboards"),
	} {
		abs, _ := filepath.Abs(src)
		if mounts[target] != abs {
			t.Errorf("grafana: %s mounted from %q, want %s", target, mounts[target], abs)
		}
	}

	var prov struct {
		Providers []struct {
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	readYAML(t, filepath.Join(dashDir, "provisioning", "dashboards", "deepseed.yaml"), &prov)
	if len(prov.Providers) != 1 {
		t.Fatalf("dashboard provisioning: %d providers, want 1", len(prov.Providers))
	}
	path := prov.Providers[0].Options.Path
	jsonDir, _ := filepath.Abs(filepath.Join(dashDir, "json"))
	if mounts[path] != jsonDir {
		t.Errorf("dashboard provider reads %s, but compose mounts dashboards/json at %v", path, mountsOf(mounts, jsonDir))
	}
	home := env(g, "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
	if filepath.Dir(home) != path {
		t.Errorf("home dashboard %s is not in the provisioned folder %s", home, path)
	} else if _, err := os.Stat(filepath.Join(jsonDir, filepath.Base(home))); err != nil {
		t.Errorf("home dashboard: %v", err)
	}
	if filepath.Base(home) != "deepseed-training-run.json" {
		t.Errorf("home dashboard %s, want the training run", home)
	}

	var ds struct {
		Datasources []struct {
			UID      string         `yaml:"uid"`
			JSONData map[string]any `yaml:"jsonData"`
		} `yaml:"datasources"`
	}
	readYAML(t, filepath.Join(dashDir, "provisioning", "datasources", "deepseed.yaml"), &ds)
	if len(ds.Datasources) != 1 {
		t.Fatalf("data source provisioning: %d data sources, want 1", len(ds.Datasources))
	}
	u, err := url.Parse(ds.Datasources[0].JSONData["url"].(string))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.GetService(u.Hostname()); err != nil || u.Port() != "8080" {
		t.Errorf("data source url %s does not reach the deepseed service: %v", u, err)
	}
}

func mountsOf(mounts map[string]string, src string) []string {
	var out []string
	for target, s := range mounts {
		if s == src {
			out = append(out, target)
		}
	}
	return out
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
