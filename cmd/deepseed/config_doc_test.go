package main

import (
	"flag"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite docs/configuration.md from the commands' -h")

const configurationPage = "../../docs/configuration.md"

// helpOnlyVariables is every DEEPSEED_ variable that some command's -h
// names in its text without it being a flag's variable, with what it is.
// The configuration page lists them; a variable -h names that is neither
// a flag's nor here fails TestConfigurationPageIsGenerated.
var helpOnlyVariables = map[string]string{
	"DEEPSEED_TOKEN":         "the bearer token a client command sends (ingest, read or submit, as the command's `--token-file` says); `--token` is refused",
	"DEEPSEED_AGENT_TOKEN":   "the token the agent sends, one of the server's `DEEPSEED_AGENT_TOKENS` (or `--token-file`)",
	"DEEPSEED_READ_TOKEN":    "the read token `bench query` sends (default: the ingest token; or `--read-token-file`)",
	"DEEPSEED_INGEST_TOKENS": "the server's comma-separated tokens that may write (POST) and read; environment only",
	"DEEPSEED_READ_TOKENS":   "the server's comma-separated tokens that may only read (GET); environment only",
	"DEEPSEED_SUBMIT_TOKENS": "the server's comma-separated tokens that may queue and cancel jobs and sweeps and set GPU quotas (and read); environment only",
	"DEEPSEED_AGENT_TOKENS":  "the server's comma-separated `NAME:TOKEN` of the agents on GPU nodes, each token only for the agent NAME; environment only",
	"DEEPSEED_PPROF_LISTEN":  "an address such as `127.0.0.1:6060` where `serve` or `collect` serves Go's profiler at `/debug/pprof/`; environment only",
	"DEEPSEED_JOB_ID":        "set by the agent in a job's environment: the job's id",
	"DEEPSEED_RUN_ID":        "set by the agent in a job's environment: the run id the hook takes",
	"DEEPSEED_SWEEP_ID":      "set by the agent in a job's environment: the job's sweep",
	"DEEPSEED_PARAM_":        "`DEEPSEED_PARAM_<NAME>`: set by the agent in a job's environment, one per `--param name=value`",
}

// machineDefaults are the flag defaults that depend on the user or the
// machine: the page says the rule, and the test checks that -h shows
// the rule's value here.
var machineDefaults = map[string]struct {
	value func() string
	rule  string
}{
	"DEEPSEED_DATA_DIR":        {defaultDataDir, "`/var/lib/deepseed` as root, else `$XDG_DATA_HOME/deepseed` or `~/.local/share/deepseed`"},
	"DEEPSEED_SPOOL_DIR":       {defaultSpoolDir, "`/var/lib/deepseed/spool` as root, else `$XDG_STATE_HOME/deepseed/spool` or `~/.local/state/deepseed/spool`"},
	"DEEPSEED_AGENT_STATE_DIR": {defaultAgentDir, "`/var/lib/deepseed/agent` as root, else `agent/` in the data directory"},
	"DEEPSEED_AGENT_NAME":      {func() string { h, _ := os.Hostname(); return h }, "the host name"},
}

// helpPage is one command's or subcommand's -h.
type helpPage struct {
	args []string
	text string
}

func (p helpPage) name() string { return strings.Join(p.args, " ") }

// helpPages runs -h of the top level, every command and every
// subcommand that a command's -h names ("deepseed job
// <submit|list|…>", "deepseed bench ingest [flags]").
func helpPages(t *testing.T) []helpPage {
	t.Helper()
	group := regexp.MustCompile(`deepseed (\w+) <([a-z]+(?:\|[a-z]+)+)>`)
	single := regexp.MustCompile(`(?m)^(?:Usage:)?\s+deepseed (\w+) ([a-z]+) \[flags\]`)
	get := func(args ...string) helpPage {
		code, out, stderr := runBinary(t, nil, append(args, "-h")...)
		if code != 0 {
			t.Fatalf("deepseed %s -h: exit %d: %s", strings.Join(args, " "), code, stderr)
		}
		return helpPage{args, out}
	}
	pages := []helpPage{get("help")}
	for _, c := range commands {
		p := get(c.name)
		pages = append(pages, p)
		seen := map[string]bool{}
		for _, m := range group.FindAllStringSubmatch(p.text, -1) {
			for _, sub := range strings.Split(m[2], "|") {
				seen[sub] = true
			}
		}
		for _, m := range single.FindAllStringSubmatch(p.text, -1) {
			seen[m[2]] = true
		}
		subs := make([]string, 0, len(seen))
		for sub := range seen {
			subs = append(subs, sub)
		}
		sort.Strings(subs)
		for _, sub := range subs {
			pages = append(pages, get(c.name, sub))
		}
	}
	return pages
}

// helpFlag is one flag as -h shows it.
type helpFlag struct{ name, env, def, usage string }

var flagMeta = regexp.MustCompile(`^\((?:env (DEEPSEED_[A-Z0-9_]+)|no environment variable)(?:, default (.*))?\)$`)

// helpFlags reads the flags of one -h, in the form printFlag writes.
func helpFlags(t *testing.T, p helpPage) []helpFlag {
	var out []helpFlag
	for _, block := range flagBlocks(p.text) {
		lines := strings.Split(block, "\n")
		m := flagMeta.FindStringSubmatch(strings.TrimSpace(lines[len(lines)-1]))
		if len(lines) < 3 || m == nil {
			t.Errorf("deepseed %s -h: a flag names no environment variable and does not say it has none:\n%s", p.name(), block)
			continue
		}
		var usage []string
		for _, l := range lines[1 : len(lines)-1] {
			usage = append(usage, strings.TrimSpace(l))
		}
		out = append(out, helpFlag{strings.TrimPrefix(strings.TrimSpace(lines[0]), "--"), m[1], m[2], strings.Join(usage, " ")})
	}
	return out
}

// grouped is a value per command, written "`a`, `b`: x; `c`: y" where
// the commands differ, and x alone where they agree.
type grouped struct {
	order []string
	cmds  map[string][]string
}

func (g *grouped) add(value, cmd string) {
	if g.cmds == nil {
		g.cmds = map[string][]string{}
	}
	if _, ok := g.cmds[value]; !ok {
		g.order = append(g.order, value)
	}
	g.cmds[value] = append(g.cmds[value], cmd)
}

func (g *grouped) String() string {
	if len(g.order) == 1 {
		return g.order[0]
	}
	parts := make([]string, 0, len(g.order))
	for _, v := range g.order {
		parts = append(parts, codeList(g.cmds[v])+": "+v)
	}
	return strings.Join(parts, "; ")
}

func codeList(xs []string) string {
	q := make([]string, len(xs))
	for i, x := range xs {
		q[i] = "`" + x + "`"
	}
	return strings.Join(q, ", ")
}

func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// configurationPageText renders docs/configuration.md from the -h
// pages, and reports where the commands break the page's rule that one
// variable is one flag (what it means in each command is on the page,
// side by side).
func configurationPageText(t *testing.T, pages []helpPage) string {
	type row struct {
		flags           map[string]bool
		cmds            []string
		defaults, usage grouped
	}
	rows := map[string]*row{}
	prose := map[string]map[string]bool{} // variable → commands whose -h names it
	variable := regexp.MustCompile(`DEEPSEED_[A-Z0-9_]*`)
	for _, p := range pages {
		for _, v := range variable.FindAllString(p.text, -1) {
			if prose[v] == nil {
				prose[v] = map[string]bool{}
			}
			prose[v][p.name()] = true
		}
		for _, f := range helpFlags(t, p) {
			if f.env == "" {
				continue
			}
			r := rows[f.env]
			if r == nil {
				r = &row{flags: map[string]bool{}}
				rows[f.env] = r
			}
			r.flags[f.name] = true
			r.cmds = append(r.cmds, p.name())
			def := "—"
			if md, ok := machineDefaults[f.env]; ok {
				if want := md.value(); f.def != want {
					t.Errorf("deepseed %s -h: --%s shows default %q, but its rule (%s) gives %q here", p.name(), f.name, f.def, md.rule, want)
				}
				def = md.rule
			} else if f.def != "" {
				def = "`" + f.def + "`"
			}
			r.defaults.add(def, p.name())
			r.usage.add(f.usage, p.name())
		}
	}
	for env, r := range rows {
		if len(r.flags) > 1 {
			t.Errorf("%s sets %d different flags (%v): one variable is one flag", env, len(r.flags), r.flags)
		}
	}
	for md := range machineDefaults {
		if rows[md] == nil {
			t.Errorf("machineDefaults names %s, which no flag takes", md)
		}
	}

	var b strings.Builder
	b.WriteString(`# Configuration

Every setting of every ` + "`deepseed`" + ` command is a flag, and nearly every flag can also be set by an
environment variable: the flag given on the command line wins, then the variable, then the built-in
default. Each command's ` + "`-h`" + ` lists its flags with their variables and defaults; this page lists
them all by variable.

This page is generated from the commands' ` + "`-h`" + ` by ` + "`go test ./cmd/deepseed -run TestConfigurationPageIsGenerated -update`" + `,
and that test fails when the page and the commands differ, so neither drifts from the other. Edit
the flags (` + "`cmd/deepseed/`" + `), not this page.

## Flags and their variables

| variable | flag | commands | default | what it sets |
|---|---|---|---|---|
`)
	envs := make([]string, 0, len(rows))
	for env := range rows {
		envs = append(envs, env)
	}
	sort.Strings(envs)
	for _, env := range envs {
		r := rows[env]
		var flag string
		for f := range r.flags {
			flag = f
		}
		fmt.Fprintf(&b, "| `%s` | `--%s` | %s | %s | %s |\n", env, flag, cell(codeList(r.cmds)), cell(r.defaults.String()), cell(r.usage.String()))
	}

	b.WriteString(`
## Variables the help names that are no flag's

| variable | named in the -h of | what it is |
|---|---|---|
`)
	var named []string
	for v := range prose {
		if rows[v] == nil {
			named = append(named, v)
		}
	}
	sort.Strings(named)
	for _, v := range named {
		what, ok := helpOnlyVariables[v]
		if !ok {
			t.Errorf("the -h of %v names %s, which is no flag's variable and helpOnlyVariables does not describe", keys(prose[v]), v)
		}
		cmds := keys(prose[v])
		for i, c := range cmds {
			if c == "help" {
				cmds[i] = "deepseed help"
			}
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", v, cell(codeList(cmds)), cell(what))
	}
	for v := range helpOnlyVariables {
		if prose[v] == nil || rows[v] != nil {
			t.Errorf("helpOnlyVariables describes %s, which no -h names or which is a flag's variable: take it out", v)
		}
	}

	b.WriteString(`
## Variables no command's help names

Read by the hook (its settings: [hook/README.md](../hook/README.md#where-records-go)), by Grafana's
provisioning, or by the tests.

| variable | read by |
|---|---|
`)
	var outside []string
	for v := range variablesOutsideHelp {
		if v != "DEEPSEED_" {
			outside = append(outside, v)
		}
	}
	sort.Strings(outside)
	for _, v := range outside {
		fmt.Fprintf(&b, "| `%s` | %s |\n", v, cell(variablesOutsideHelp[v]))
	}
	return b.String()
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// docs/configuration.md is what the commands' -h say, variable by
// variable: every variable a -h names is on it, with its flag, commands,
// default and meaning. -update rewrites it.
func TestConfigurationPageIsGenerated(t *testing.T) {
	want := configurationPageText(t, helpPages(t))
	if *update {
		if err := os.WriteFile(configurationPage, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(configurationPage)
	if err != nil {
		t.Fatalf("%v (write it with go test ./cmd/deepseed -run TestConfigurationPageIsGenerated -update)", err)
	}
	if string(got) != want {
		t.Errorf("docs/configuration.md differs from the commands' -h; rewrite it with go test ./cmd/deepseed -run TestConfigurationPageIsGenerated -update\n%s",
			firstDifference(string(got), want))
	}
}

// firstDifference names the first line where two texts part.
func firstDifference(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := 0; i < len(g) || i < len(w); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return fmt.Sprintf("line %d:\n  page: %s\n  -h:   %s", i+1, gl, wl)
		}
	}
	return ""
}
