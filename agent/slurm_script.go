package agent

import (
	"fmt"
	"strings"
)

// A job reaches Slurm as a small batch script rather than through sbatch
// --wrap: the script exports Spec.Env with exact quoting (sbatch --export
// splits its list at commas, so a value with a comma would not survive),
// runs the command as a child so it can record the exit status in a file
// for when neither sacct nor slurmctld still knows the job, and stays
// beside the output for whoever wants to see what was run. Every argv item
// and value is single-quoted, the one quoting in which sh gives no
// character a meaning: nothing in it is expanded, split or globbed.

// batchScript returns the batch script of spec, which writes the
// command's exit status to exitFile.
func batchScript(spec Spec, exitFile string) (string, error) {
	var b strings.Builder
	b.WriteString("#!/bin/sh\n")
	fmt.Fprintf(&b, "# DeepSeed job %s, submitted by the DeepSeed agent.\n", oneLine(spec.JobID))
	b.WriteString("# The command runs as a child of this script, which keeps its exit status.\n")
	// Slurm signals every process of the job on a cancel. Were this
	// shell to die of the SIGTERM, the batch step would end and slurmstepd
	// would SIGKILL the command at once, leaving it no time to save a
	// checkpoint; trapped, the shell waits for the command instead (which
	// gets the default disposition back: a trap is not inherited, an
	// ignored signal would be).
	b.WriteString("trap : TERM\n")
	for _, kv := range spec.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return "", fmt.Errorf("env %q: want KEY=VALUE", kv)
		}
		if !shellName(k) {
			return "", fmt.Errorf("env %q: the name must be letters, digits and _, not starting with a digit", k)
		}
		if strings.IndexByte(v, 0) >= 0 {
			return "", fmt.Errorf("env %s: value contains a NUL byte", k)
		}
		fmt.Fprintf(&b, "export %s=%s\n", k, shellQuote(v))
	}
	for i, a := range spec.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			return "", fmt.Errorf("argv[%d] contains a NUL byte", i)
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(shellQuote(a))
	}
	b.WriteString("\nstatus=$?\n")
	fmt.Fprintf(&b, "printf '%%s\\n' \"$status\" >%s\n", shellQuote(exitFile))
	b.WriteString("exit \"$status\"\n")
	return b.String(), nil
}

// shellQuote quotes s for sh: inside single quotes every byte stands for
// itself; a single quote ends the quoting, is given escaped, and the
// quoting starts again.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// shellName reports whether k can be an environment variable sh exports.
func shellName(k string) bool {
	if k == "" {
		return false
	}
	for i, c := range []byte(k) {
		switch {
		case c == '_', c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// exitPath is where the batch script of the job with output file out
// writes its exit status.
func exitPath(out string) string {
	return strings.TrimSuffix(out, ".out") + ".exit"
}
