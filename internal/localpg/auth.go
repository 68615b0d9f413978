package localpg

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// The private cluster's superuser logs in with a password (scram-sha-256),
// never by trust: any local user can reach 127.0.0.1, and trust would
// make each of them its superuser. The password is generated when the
// cluster is created and kept, readable by its owner only, beside the data
// directory (Dir + ".password"), where every deepseed process that uses
// the cluster reads it.

// passwordPath is where the superuser's password is kept.
func (lp *Cluster) passwordPath() string { return lp.Dir + ".password" }

// ReadPassword returns the superuser password of the private cluster
// in data directory dir, as kept by [Cluster.Start].
func ReadPassword(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Clean(dir) + ".password")
	if err != nil {
		return "", fmt.Errorf("local postgres: read the superuser password: %w", err)
	}
	pw := strings.TrimSpace(string(b))
	if pw == "" {
		return "", fmt.Errorf("local postgres: %s.password is empty", filepath.Clean(dir))
	}
	return pw, nil
}

// newPassword writes a fresh random password to the password file, mode
// 0600, replacing any there, and remembers it.
func (lp *Cluster) newPassword() error {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return fmt.Errorf("local postgres: generate a password: %w", err)
	}
	pw := hex.EncodeToString(b)
	path := lp.passwordPath()
	tmp := path + ".tmp"
	_ = os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("local postgres: write the password file: %w", err)
	}
	_, err = f.WriteString(pw + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("local postgres: write the password file: %w", err)
	}
	lp.password = pw
	return nil
}

// loadPassword reads the kept password into lp.
func (lp *Cluster) loadPassword() error {
	pw, err := ReadPassword(lp.Dir)
	if err != nil {
		return err
	}
	lp.password = pw
	return nil
}

// initdb creates the cluster with password authentication for every
// connection and a fresh superuser password.
func (lp *Cluster) initdb(ctx context.Context) error {
	if err := lp.newPassword(); err != nil {
		return err
	}
	// initdb reads the password from a file it can open: it runs as the
	// cluster's user, which cannot read the 0600 file of a root owner.
	pwfile := lp.Dir + ".initdb-pw"
	if err := os.WriteFile(pwfile, []byte(lp.password+"\n"), 0o600); err != nil {
		return fmt.Errorf("local postgres: initdb password file: %w", err)
	}
	defer os.Remove(pwfile)
	if lp.cred != nil {
		if err := os.Chown(pwfile, int(lp.cred.Uid), int(lp.cred.Gid)); err != nil {
			return fmt.Errorf("local postgres: initdb password file: %w", err)
		}
	}
	out, err := lp.command(ctx, "initdb", "-D", lp.Dir, "-U", "postgres", "--auth=scram-sha-256",
		"--pwfile="+pwfile, "-E", "UTF8", "--locale=C").CombinedOutput()
	if err != nil {
		return fmt.Errorf("local postgres: initdb: %w: %s", err, lastLines(out))
	}
	return nil
}

// secureLegacy gives a cluster created with trust authentication (by an
// earlier version) a password and switches it to scram-sha-256. It runs
// once the cluster answers; a cluster with no trust line is left alone.
func (lp *Cluster) secureLegacy(ctx context.Context, log *slog.Logger) error {
	hba := filepath.Join(lp.Dir, "pg_hba.conf")
	b, err := os.ReadFile(hba)
	if err != nil {
		return fmt.Errorf("local postgres: read pg_hba.conf: %w", err)
	}
	lines := strings.Split(string(b), "\n")
	trust := false
	for i, l := range lines {
		f := strings.Fields(l)
		if len(f) > 0 && !strings.HasPrefix(f[0], "#") && f[len(f)-1] == "trust" {
			lines[i] = strings.TrimSuffix(strings.TrimRight(l, " \t"), "trust") + "scram-sha-256"
			trust = true
		}
	}
	if !trust {
		return nil
	}
	if lp.password == "" {
		if err := lp.newPassword(); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgconn.Connect(ctx, lp.URL("postgres"))
	if err != nil {
		return fmt.Errorf("local postgres: connect to set a password: %w", err)
	}
	defer conn.Close(ctx)
	// The password travels as a SCRAM verifier computed by the server's
	// own password_encryption (scram-sha-256 by default since 14).
	if _, err := conn.Exec(ctx, `SET password_encryption = 'scram-sha-256'`).ReadAll(); err != nil {
		return fmt.Errorf("local postgres: set password encryption: %w", err)
	}
	if _, err := conn.Exec(ctx, `ALTER ROLE postgres PASSWORD `+quoteLiteral(lp.password)).ReadAll(); err != nil {
		return fmt.Errorf("local postgres: set the superuser password: %w", err)
	}
	if err := os.WriteFile(hba, []byte(strings.Join(lines, "\n")), 0o600); err != nil {
		return fmt.Errorf("local postgres: write pg_hba.conf: %w", err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_reload_conf()`).ReadAll(); err != nil {
		return fmt.Errorf("local postgres: reload pg_hba.conf: %w", err)
	}
	log.Warn("the private PostgreSQL trusted every local connection; it now takes a password (scram-sha-256)",
		"dir", lp.Dir, "password_file", lp.passwordPath())
	return nil
}

// quoteLiteral quotes s as an SQL string literal (the password is hex, so
// this is belt and braces).
func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// traversable returns an error naming the first parent directory of dir
// that uid (with gid) cannot enter, and what to change: the cluster's user
// must reach its data directory, and serve changes no directory it did
// not create.
func traversable(dir string, uid, gid int, name string) error {
	for d := filepath.Dir(dir); ; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("local postgres: %w", err)
		}
		if !canEnter(st, uid, gid) {
			return fmt.Errorf("local postgres: PostgreSQL runs as user %s (uid %d), which cannot enter %s (mode %04o); "+
				"let it through (chmod o+x %s) or put the data directory where it can reach, e.g. under /var/lib",
				name, uid, d, st.Mode().Perm(), d)
		}
		if d == "/" || d == "." || d == filepath.Dir(d) {
			return nil
		}
	}
}

// URL returns the connection URL of database db on the running cluster,
// with the superuser's password.
func (lp *Cluster) URL(db string) string {
	u := url.URL{Scheme: "postgres", Host: fmt.Sprintf("127.0.0.1:%d", lp.Port), Path: "/" + db,
		RawQuery: "sslmode=disable"}
	if lp.password != "" {
		u.User = url.UserPassword("postgres", lp.password)
	} else {
		u.User = url.User("postgres")
	}
	return u.String()
}

// pingPostgres reports whether a PostgreSQL on 127.0.0.1:port accepts a
// connection as the private cluster's superuser.
func (lp *Cluster) pingPostgres(ctx context.Context, port int) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	u := *lp
	u.Port = port
	conn, err := pgconn.Connect(ctx, u.URL("postgres")+"&connect_timeout=2")
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

// canEnter reports whether uid (in group gid) may search directory st.
func canEnter(st os.FileInfo, uid, gid int) bool {
	m := st.Mode().Perm()
	s, ok := st.Sys().(*syscall.Stat_t)
	switch {
	case !ok:
		return m&0o001 != 0
	case int(s.Uid) == uid:
		return m&0o100 != 0
	case int(s.Gid) == gid:
		return m&0o010 != 0
	default:
		return m&0o001 != 0
	}
}
