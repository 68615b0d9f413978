package localpg

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// StartStandby makes standby a streaming replica of the running cluster
// lp and starts it: pg_basebackup -R copies lp into standby.Dir, which
// must be empty or absent, and writes the connection to lp into it
// (primary_conninfo, standby.signal); the copy then starts as a hot
// standby, replaying lp's write-ahead log as it streams, on standby.Port
// (0 picks a free one). lp must have been started by this process. The
// standby takes lp's settings unless it has its own. It returns the URL
// of the standby's "postgres" database; Stop stops it.
//
// PostgreSQL's defaults (wal_level=replica, max_wal_senders=10,
// hot_standby=on, and initdb's pg_hba.conf lines for replication from
// loopback) are all this needs.
func (lp *Cluster) StartStandby(ctx context.Context, standby *Cluster) (string, error) {
	if lp.lock == nil || lp.bin == "" {
		return "", errors.New("local postgres: start standby: the primary was not started by this process")
	}
	standby.Dir = filepath.Clean(standby.Dir)
	if entries, err := os.ReadDir(standby.Dir); err == nil && len(entries) > 0 {
		return "", fmt.Errorf("local postgres: start standby: %s is not empty", standby.Dir)
	}
	if err := os.MkdirAll(standby.Dir, 0o700); err != nil {
		return "", fmt.Errorf("local postgres: start standby: create data dir: %w", err)
	}
	if lp.cred != nil {
		if err := os.Chown(standby.Dir, int(lp.cred.Uid), int(lp.cred.Gid)); err != nil {
			return "", fmt.Errorf("local postgres: start standby: hand data dir to uid %d: %w", lp.cred.Uid, err)
		}
	}
	if standby.Settings == nil {
		standby.Settings = lp.Settings
	}
	standby.WithoutTimescale = standby.WithoutTimescale || lp.WithoutTimescale
	// The standby is a copy: same superuser, same password, which
	// pg_basebackup -R also writes into the standby's primary_conninfo.
	standby.password = lp.password
	if err := os.WriteFile(standby.passwordPath(), []byte(lp.password+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("local postgres: start standby: write the password file: %w", err)
	}
	bb := lp.command(ctx, "pg_basebackup", "-D", standby.Dir, "-R", "-X", "stream", "-c", "fast",
		"-h", "127.0.0.1", "-p", strconv.Itoa(lp.Port), "-U", "postgres")
	bb.Env = append(bb.Env, "PGPASSWORD="+lp.password)
	out, err := bb.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("local postgres: pg_basebackup from port %d: %w: %s", lp.Port, err, lastLines(out))
	}
	// The copy holds the primary's log file; the standby writes its own.
	_ = os.Remove(filepath.Join(standby.Dir, "server.log"))
	url, err := standby.Start(ctx)
	if err != nil {
		return "", fmt.Errorf("local postgres: start standby: %w", err)
	}
	return url, nil
}
