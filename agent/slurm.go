package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// SlurmConfig configures the Slurm executor. Only OutputDir is required;
// the command paths default to the names found in PATH.
type SlurmConfig struct {
	// Paths (or names looked up in PATH) of the Slurm commands. Sacct may
	// be missing: without it, and where accounting is disabled, the final
	// state comes from squeue while slurmctld remembers the job
	// (MinJobAge), then from the exit file the batch script writes.
	Sbatch, Squeue, Sacct, Scancel string

	// Partition and Account, when set, are passed to sbatch as
	// --partition and --account. ExtraArgs are more sbatch options, passed
	// as they are before the script (for example --time=24:00:00 or
	// --qos=long).
	Partition string
	Account   string
	ExtraArgs []string

	// OutputDir holds each job's batch script, its output (stdout and
	// stderr together) and its exit file. It must be reachable at the same
	// path from the compute nodes (a shared file system). Created if
	// missing.
	OutputDir string

	// Env is added to the environment of every Slurm command (for example
	// SLURM_CONF=/etc/slurm-test/slurm.conf). The job itself gets the
	// allow-listed variables of the agent's environment (see JobConfig;
	// sbatch --export names them), the SLURM_* ones Slurm always passes,
	// and Spec.Env, which its batch script exports.
	Env []string

	// Job says as whom jobs run (RunAs becomes sbatch --uid and --gid,
	// which only root may give) and what they are given.
	Job JobConfig

	// CommandTimeout bounds every Slurm command (default 30s).
	CommandTimeout time.Duration
	// TailBytes bounds Status.OutputTail (default 8 KiB).
	TailBytes int

	Logger *slog.Logger
}

// Slurm is an Executor that submits each job as a Slurm batch job.
type Slurm struct {
	cfg  SlurmConfig
	log  *slog.Logger
	user *jobUser // nil: the agent's own

	mu        sync.Mutex
	cancelled map[string]bool // Slurm job ids this executor has signalled to stop
}

var _ Executor = (*Slurm)(nil)

// NewSlurm checks cfg, finds the Slurm commands and creates OutputDir.
func NewSlurm(cfg SlurmConfig) (*Slurm, error) {
	if cfg.OutputDir == "" {
		return nil, errors.New("slurm: OutputDir is required")
	}
	u, err := cfg.Job.resolve()
	if err != nil {
		return nil, fmt.Errorf("slurm: %w", err)
	}
	dir, err := filepath.Abs(cfg.OutputDir)
	if err != nil {
		return nil, fmt.Errorf("slurm: output dir %q: %w", cfg.OutputDir, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("slurm: output dir: %w", err)
	}
	cfg.OutputDir = dir
	for _, c := range []struct {
		p        *string
		name     string
		optional bool
	}{
		{&cfg.Sbatch, "sbatch", false},
		{&cfg.Squeue, "squeue", false},
		{&cfg.Scancel, "scancel", false},
		{&cfg.Sacct, "sacct", true},
	} {
		if *c.p == "" {
			*c.p = c.name
		}
		path, err := exec.LookPath(*c.p)
		switch {
		case err == nil:
			*c.p = path
		case c.optional:
			*c.p = "" // final states come from squeue or the exit file
		default:
			return nil, fmt.Errorf("slurm: %s: %w", c.name, err)
		}
	}
	for _, kv := range cfg.Env {
		if !strings.Contains(kv, "=") {
			return nil, fmt.Errorf("slurm: env %q: want KEY=VALUE", kv)
		}
	}
	if cfg.CommandTimeout <= 0 {
		cfg.CommandTimeout = 30 * time.Second
	}
	if cfg.TailBytes <= 0 {
		cfg.TailBytes = 8 << 10
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Slurm{cfg: cfg, log: cfg.Logger.With("executor", "slurm"), user: u, cancelled: map[string]bool{}}, nil
}

// Name returns "slurm".
func (s *Slurm) Name() string { return "slurm" }

// Start writes the job's batch script and submits it with sbatch. The
// handle's ExternalID is the Slurm job id.
func (s *Slurm) Start(ctx context.Context, spec Spec) (Handle, error) {
	if len(spec.Argv) == 0 || spec.Argv[0] == "" {
		return Handle{}, errors.New("slurm: empty command")
	}
	if spec.GPUs < 0 {
		return Handle{}, fmt.Errorf("slurm: gpus %d: must not be negative", spec.GPUs)
	}
	base := filepath.Join(s.cfg.OutputDir, "deepseed-"+fileSafe(spec.JobID)+"-"+randHex(4))
	out, scriptPath := base+".out", base+".sh"
	script, err := batchScript(spec, exitPath(out))
	if err != nil {
		return Handle{}, fmt.Errorf("slurm: job %s: %w", spec.JobID, err)
	}
	if err := os.WriteFile(scriptPath, []byte(script), 0o700); err != nil {
		return Handle{}, fmt.Errorf("slurm: write batch script: %w", err)
	}
	name := oneLine(spec.Name)
	if name == "" {
		name = "deepseed-" + oneLine(spec.JobID)
	}
	args := []string{
		"--parsable",
		"--job-name=" + name,
		"--comment=" + jobComment(spec),
		"--output=" + out,
	}
	dir := spec.Dir
	if dir == "" {
		dir = base + ".work"
		if err := jobDir(dir, s.user); err != nil {
			_ = os.Remove(scriptPath)
			return Handle{}, fmt.Errorf("slurm: %w", err)
		}
	}
	args = append(args, "--chdir="+dir)
	// The job's environment is sbatch's, which holds the allow-listed
	// variables only; --export names them so that nothing else (such as
	// the user's login environment) is added.
	env := jobEnviron(os.Environ(), Spec{}, s.user, s.cfg.Job.CollectorURL)
	if names := envNames(env); len(names) > 0 {
		args = append(args, "--export="+strings.Join(names, ","))
	} else {
		args = append(args, "--export=NONE")
	}
	if u := s.user; u != nil {
		args = append(args, "--uid="+strconv.FormatUint(uint64(u.uid), 10), "--gid="+strconv.FormatUint(uint64(u.gid), 10))
	}
	if spec.GPUs > 0 {
		args = append(args, "--gres=gpu:"+strconv.Itoa(spec.GPUs))
	}
	if s.cfg.Partition != "" {
		args = append(args, "--partition="+s.cfg.Partition)
	}
	if s.cfg.Account != "" {
		args = append(args, "--account="+s.cfg.Account)
	}
	args = append(args, s.cfg.ExtraArgs...)
	args = append(args, scriptPath)
	stdout, err := s.runEnv(ctx, append(env, slurmEnv(os.Environ())...), s.cfg.Sbatch, args...)
	if err != nil {
		_ = os.Remove(scriptPath)
		if spec.Dir == "" {
			_ = os.Remove(dir) // nothing ran in it
		}
		return Handle{}, err
	}
	id, err := parseParsable(stdout)
	if err != nil {
		return Handle{}, fmt.Errorf("slurm: sbatch: %w", err)
	}
	s.log.Info("job submitted", "job", spec.JobID, "slurm_job", id, "gpus", spec.GPUs)
	return Handle{Executor: s.Name(), ExternalID: id, StartedAt: time.Now().UTC(), OutputPath: out}, nil
}

// CommandError is a Slurm command that failed: its command line, its
// standard error and how it ended.
type CommandError struct {
	Command string
	Stderr  string
	Err     error
}

func (e *CommandError) Error() string {
	if e.Stderr == "" {
		return fmt.Sprintf("slurm: %s: %v", e.Command, e.Err)
	}
	return fmt.Sprintf("slurm: %s: %v: %s", e.Command, e.Err, e.Stderr)
}

func (e *CommandError) Unwrap() error { return e.Err }

// run runs one Slurm command with the configured timeout and environment,
// without a shell, and returns its standard output.
func (s *Slurm) run(ctx context.Context, bin string, args ...string) ([]byte, error) {
	return s.runEnv(ctx, os.Environ(), bin, args...)
}

// runEnv is run with env in place of the agent's environment (the
// configured Env is added to it).
func (s *Slurm) runEnv(ctx context.Context, env []string, bin string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.CommandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(slices.Clip(env), s.cfg.Env...)
	cmd.WaitDelay = 2 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", err, ctx.Err())
		}
		return stdout.Bytes(), &CommandError{
			Command: filepath.Base(bin) + " " + strings.Join(args, " "),
			Stderr:  strings.TrimSpace(stderr.String()),
			Err:     err,
		}
	}
	return stdout.Bytes(), nil
}

// slurmEnv returns the variables of env that configure Slurm's commands
// (SLURM_*, SBATCH_*); Slurm passes SLURM_* on to every job anyway.
func slurmEnv(env []string) []string {
	var out []string
	for _, kv := range env {
		if strings.HasPrefix(kv, "SLURM_") || strings.HasPrefix(kv, "SBATCH_") {
			out = append(out, kv)
		}
	}
	return out
}

// goneError reports whether a Slurm command failed only because the job
// is unknown or has already ended.
func goneError(err error) bool {
	var ce *CommandError
	if !errors.As(err, &ce) {
		return false
	}
	return strings.Contains(ce.Stderr, "Invalid job id") ||
		strings.Contains(ce.Stderr, "already completing or completed")
}

// parseParsable reads sbatch --parsable's answer: "jobid" or
// "jobid;cluster".
func parseParsable(out []byte) (string, error) {
	line := strings.TrimSpace(string(out))
	if i := strings.LastIndexByte(line, '\n'); i >= 0 {
		line = line[i+1:] // warnings may come first
	}
	id, _, _ := strings.Cut(line, ";")
	if _, err := strconv.ParseUint(id, 10, 64); err != nil {
		return "", fmt.Errorf("unexpected answer %q: want a job id", line)
	}
	return id, nil
}

func slurmJobID(h Handle) (string, error) {
	if _, err := strconv.ParseUint(h.ExternalID, 10, 64); err != nil {
		return "", fmt.Errorf("slurm: handle %q: not a Slurm job id", h.ExternalID)
	}
	return h.ExternalID, nil
}

// jobComment is the --comment of a job: its DeepSeed id and name, so an
// administrator can tell from squeue or sacct what a job is.
func jobComment(spec Spec) string {
	c := "deepseed job=" + oneLine(spec.JobID)
	if spec.Name != "" {
		c += " name=" + oneLine(spec.Name)
	}
	return c
}

// oneLine replaces control characters, so a value stays on one line of a
// batch script or a Slurm field.
func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return '_'
		}
		return r
	}, s)
}

// fileSafe makes a job id usable in a file name.
func fileSafe(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			b[i] = '_'
		}
	}
	if len(b) > 64 {
		b = b[:64]
	}
	if len(b) == 0 {
		return "job"
	}
	return string(b)
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
