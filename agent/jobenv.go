package agent

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// A job gets what it needs and nothing else: an environment built from an
// allow-list of the agent's own (never its token, the server's URL or
// anything else a job could misuse), the job's variables from the server,
// and the node's collector URL. The names below are the allow-list.
var (
	jobEnvNames    = []string{"PATH", "LANG", "TZ", "TMPDIR"}
	jobEnvPrefixes = []string{"LC_", "CUDA_", "NCCL_", "NVIDIA_"}
)

// JobConfig is what every executor applies to the jobs it starts.
type JobConfig struct {
	// RunAs is the user jobs run as (local executor: the process's user;
	// Slurm: sbatch --uid, which needs a root agent). Empty runs them as
	// the agent's own user, which is refused for root unless AllowRoot.
	RunAs string
	// AllowRoot lets jobs run as root: an agent running as root with no
	// RunAs, or a RunAs of uid 0.
	AllowRoot bool
	// CollectorURL is the node's collector, given to jobs as
	// DEEPSEED_COLLECTOR_URL; empty leaves the hook's default.
	CollectorURL string
}

// jobUser is who a job runs as.
type jobUser struct {
	name     string
	uid, gid uint32
	groups   []uint32
	home     string
}

// resolve checks c and looks its user up: nil means the agent's own user.
// It refuses root unless AllowRoot.
func (c JobConfig) resolve() (*jobUser, error) {
	if c.RunAs == "" {
		if os.Geteuid() == 0 && !c.AllowRoot {
			return nil, errors.New("refusing to run jobs as root: give --run-as USER (DEEPSEED_AGENT_RUN_AS), an unprivileged user the jobs run as, or --allow-root-jobs (DEEPSEED_AGENT_ALLOW_ROOT_JOBS) to run them as root anyway")
		}
		return nil, nil
	}
	u, err := user.Lookup(c.RunAs)
	if err != nil {
		return nil, fmt.Errorf("run-as %q: %w", c.RunAs, err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("run-as %q: uid %q, gid %q are not numbers", c.RunAs, u.Uid, u.Gid)
	}
	if uid == 0 && !c.AllowRoot {
		return nil, fmt.Errorf("run-as %q is root: name an unprivileged user, or give --allow-root-jobs (DEEPSEED_AGENT_ALLOW_ROOT_JOBS) to run jobs as root anyway", c.RunAs)
	}
	if uint32(uid) != uint32(os.Geteuid()) && os.Geteuid() != 0 {
		return nil, fmt.Errorf("run-as %q: only an agent running as root can start jobs as another user", c.RunAs)
	}
	ju := &jobUser{name: u.Username, uid: uint32(uid), gid: uint32(gid), home: u.HomeDir}
	ids, err := u.GroupIds()
	if err != nil {
		return nil, fmt.Errorf("run-as %q: groups: %w", c.RunAs, err)
	}
	for _, g := range ids {
		if n, err := strconv.ParseUint(g, 10, 32); err == nil {
			ju.groups = append(ju.groups, uint32(n))
		}
	}
	return ju, nil
}

// jobEnviron is the environment of a job: the allow-listed variables of
// agentEnv, HOME (and USER, LOGNAME) of the user it runs as, the node's
// collector URL, then spec.Env (its ids and parameters, from the
// server), then extra (CUDA_VISIBLE_DEVICES).
func jobEnviron(agentEnv []string, spec Spec, u *jobUser, collectorURL string, extra ...string) []string {
	var env []string
	for _, kv := range agentEnv {
		k, _, ok := strings.Cut(kv, "=")
		if ok && allowed(k) {
			env = append(env, kv)
		}
	}
	if u != nil {
		env = append(env, "HOME="+u.home, "USER="+u.name, "LOGNAME="+u.name)
	} else {
		for _, kv := range agentEnv {
			if k, _, _ := strings.Cut(kv, "="); k == "HOME" || k == "USER" || k == "LOGNAME" {
				env = append(env, kv)
			}
		}
	}
	if collectorURL != "" {
		env = append(env, "DEEPSEED_COLLECTOR_URL="+collectorURL)
	}
	env = append(env, spec.Env...)
	return append(env, extra...)
}

func allowed(name string) bool {
	if slices.Contains(jobEnvNames, name) {
		return true
	}
	for _, p := range jobEnvPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// envNames returns the variable names of env, in order, each once.
func envNames(env []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	return out
}

// reachable checks that user u can enter dir: every directory above it
// must let u search it, else jobs could not start in their working
// directory under it.
func reachable(dir string, u *jobUser) error {
	if u == nil {
		return nil
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	for d := filepath.Dir(abs); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		if !searchable(fi, u) {
			return fmt.Errorf("run-as %s cannot enter %s (mode %04o): the jobs' working directories under %s would be out of its reach; use a --state-dir that others may enter (such as /var/lib/deepseed/agent) or chmod o+x %s",
				u.name, d, fi.Mode().Perm(), abs, d)
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

// searchable reports whether u may search (enter) the directory fi.
func searchable(fi os.FileInfo, u *jobUser) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return true
	}
	perm := fi.Mode().Perm()
	switch {
	case st.Uid == u.uid:
		return perm&0o100 != 0
	case st.Gid == u.gid || slices.Contains(u.groups, st.Gid):
		return perm&0o010 != 0
	}
	return perm&0o001 != 0
}

// jobDir makes dir, the working directory of one job, owned by the user
// the job runs as (when it is not the agent's).
func jobDir(dir string, u *jobUser) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("job directory: %w", err)
	}
	if u != nil {
		if err := os.Chown(dir, int(u.uid), int(u.gid)); err != nil {
			return fmt.Errorf("job directory: give it to %s: %w", u.name, err)
		}
	}
	return nil
}
