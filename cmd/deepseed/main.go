// Command deepseed is DeepSeed's one binary: the server (ingest and query
// API), the node collector, migrations, import, the demo loader and the
// load tools.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// Version is set at build time with -ldflags "-X main.Version=…".
var Version = "dev"

type command interface {
	Run(ctx context.Context, args []string) error
}

var commands = []struct {
	name, summary string
	new           func() command
}{
	{"serve", "run the HTTP API (ingest and query) against PostgreSQL/TimescaleDB", func() command { return &ServeCommand{} }},
	{"collect", "run the node collector: NVML and host sampling, hook receiver, forwarding", func() command { return &CollectCommand{} }},
	{"migrate", "apply pending database migrations and exit", func() command { return &MigrateCommand{} }},
	{"import", "import a training_metrics.json export, or send NDJSON records (offline or dead-letter files)", func() command { return &ImportCommand{} }},
	{"demo", "write realistic simulated runs through the ingest API", func() command { return &DemoCommand{} }},
	{"bench", "load tools: bench ingest posts realistic batches and reports records/s", func() command { return &BenchCommand{} }},
	{"agent", "run queued jobs on this node's GPUs (local processes, or Slurm)", func() command { return &AgentCommand{} }},
	{"job", "submit, list, show and cancel jobs", func() command { return &JobCommand{} }},
	{"sweep", "queue a parameter sweep and rank its trials", func() command { return &SweepCommand{} }},
	{"quota", "set and show GPU-hour quotas of projects", func() command { return &QuotaCommand{} }},
	{"runs", "list runs with their status, steps, loss, step time and MFU", func() command { return &RunsCommand{} }},
	{"run", "show one run: run show ID, with its stragglers and open alerts", func() command { return &RunCommand{} }},
	{"version", "print the version", func() command { return &VersionCommand{} }},
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:])
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		// Help that was asked for has been printed.
	case errors.Is(err, errUsage):
		os.Exit(2)
	default:
		// One line: what failed, in words, with what to do where known.
		msg := strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", "; ")), " ")
		fmt.Fprintln(os.Stderr, "deepseed:", msg)
		os.Exit(1)
	}
}

// errUsage means the command line named no command; the usage has been
// printed to standard error.
var errUsage = errors.New("usage")

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		usage(os.Stderr)
		return errUsage
	}
	name := args[0]
	switch name {
	case "help", "-h", "-help", "--help":
		// "deepseed help job submit" is "deepseed job submit -h"; help
		// about help ("help -h", "-h -h") is the usage, not a loop.
		if len(args) > 1 && !isHelpWord(args[1]) {
			return run(ctx, append(append([]string{}, args[1:]...), "-h"))
		}
		usage(os.Stdout)
		return nil
	case "--version", "-version", "-V":
		// The same line as "deepseed version".
		name = "version"
	}
	for _, c := range commands {
		if c.name == name {
			return c.new().Run(ctx, args[1:])
		}
	}
	return fmt.Errorf("unknown command %q (deepseed help lists the commands)", name)
}

func isHelpWord(s string) bool {
	switch s {
	case "help", "-h", "-help", "--help":
		return true
	}
	return false
}

func usage(w io.Writer) {
	fmt.Fprint(w, `DeepSeed: training telemetry for PyTorch and DeepSpeed.

Usage:
  deepseed <command> [flags]

Commands:
`)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, `
Run "deepseed help <command>" or "deepseed <command> -h" for its flags.
Every flag can also be set by the environment variable shown in its help.
"deepseed --version" and "deepseed version" print the version.

Getting started:
  deepseed serve                 with PostgreSQL installed, starts a private
                                 database in the data directory and the API;
                                 without tokens it listens on 127.0.0.1:8080 only
  DEEPSEED_DATABASE_URL=postgres://… deepseed serve
                                 uses an existing PostgreSQL or TimescaleDB
  DEEPSEED_INGEST_TOKENS, DEEPSEED_READ_TOKENS
                                 comma-separated bearer tokens of the server;
                                 unset: no token needed, on loopback only; the
                                 job routes always need DEEPSEED_SUBMIT_TOKENS
                                 and DEEPSEED_AGENT_TOKENS
  DEEPSEED_TOKEN, --token-file   the token a client command sends (the agent:
                                 DEEPSEED_AGENT_TOKEN); --token is refused
`)
}

// VersionCommand prints the version.
type VersionCommand struct{}

// Run implements command.
func (c *VersionCommand) Run(ctx context.Context, args []string) error {
	f := newEnvFlags("version")
	f.setUsage("deepseed version (or deepseed --version)", "Print the version.", "")
	if err := f.parse(args); err != nil {
		return err
	}
	if f.fs.NArg() > 0 {
		return errors.New("version: takes no arguments")
	}
	fmt.Println("deepseed", Version)
	return nil
}
