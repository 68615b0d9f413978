package localpg_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/deepseed/deepseed/internal/localpg"
	"github.com/deepseed/deepseed/store/storetest"
)

func startLocal(t *testing.T, lp *localpg.Cluster) {
	t.Helper()
	if _, err := lp.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lp.Stop() })
}

// connectAs tries a login as postgres with password pw ("" for none).
func connectAs(port int, pw string) error {
	ctx := context.Background()
	auth := "postgres"
	if pw != "" {
		auth += ":" + pw
	}
	c, err := pgx.Connect(ctx, fmt.Sprintf("postgres://%s@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=5", auth, port))
	if err != nil {
		return err
	}
	return c.Close(ctx)
}

// The private cluster takes its superuser's generated password and
// nothing else; the password is kept 0600 beside the data directory.
func TestLocalPostgresNeedsItsPassword(t *testing.T) {
	lp := &localpg.Cluster{Dir: filepath.Join(storetest.DataDir(t), "pg"), WithoutTimescale: true}
	startLocal(t, lp)

	st, err := os.Stat(lp.Dir + ".password")
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("password file mode %04o, want 0600", st.Mode().Perm())
	}
	pw, err := localpg.ReadPassword(lp.Dir)
	if err != nil || len(pw) < 32 {
		t.Fatalf("password %q, %v; want a long generated one", pw, err)
	}
	if err := connectAs(lp.Port, ""); err == nil {
		t.Error("the private PostgreSQL let in a login without a password")
	}
	if err := connectAs(lp.Port, "wrong"); err == nil {
		t.Error("the private PostgreSQL let in a login with a wrong password")
	}
	if err := connectAs(lp.Port, pw); err != nil {
		t.Errorf("login with the kept password: %v", err)
	}
	hba, _ := os.ReadFile(filepath.Join(lp.Dir, "pg_hba.conf"))
	for _, l := range strings.Split(string(hba), "\n") {
		if f := strings.Fields(l); len(f) > 0 && !strings.HasPrefix(f[0], "#") && f[len(f)-1] != "scram-sha-256" {
			t.Errorf("pg_hba.conf line %q: want scram-sha-256", l)
		}
	}
	if !strings.Contains(lp.URL("postgres"), pw) {
		t.Error("URL does not carry the password its clients need")
	}
}

// A cluster made by an earlier version with trust authentication gets a
// password and scram-sha-256 at its next start, its data kept.
func TestLocalPostgresSecuresATrustCluster(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(storetest.DataDir(t), "pg")
	lp := &localpg.Cluster{Dir: dir, WithoutTimescale: true}
	if _, err := lp.Start(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := pgx.Connect(ctx, lp.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, `CREATE TABLE kept (v int); INSERT INTO kept VALUES (7)`); err != nil {
		t.Fatal(err)
	}
	c.Close(ctx)
	if err := lp.Stop(); err != nil {
		t.Fatal(err)
	}
	// As the earlier version left it: trust everywhere, no password file.
	hbaPath := filepath.Join(dir, "pg_hba.conf")
	hba, _ := os.ReadFile(hbaPath)
	if err := os.WriteFile(hbaPath, []byte(strings.ReplaceAll(string(hba), "scram-sha-256", "trust")), 0o600); err != nil {
		t.Fatal(err)
	}
	old, _ := localpg.ReadPassword(dir)
	if err := os.Remove(dir + ".password"); err != nil {
		t.Fatal(err)
	}

	again := &localpg.Cluster{Dir: dir, WithoutTimescale: true}
	startLocal(t, again)
	pw, err := localpg.ReadPassword(dir)
	if err != nil || pw == old {
		t.Fatalf("password after securing: %q, %v; want a new one", pw, err)
	}
	if err := connectAs(again.Port, ""); err == nil {
		t.Error("the secured cluster still lets in a login without a password")
	}
	c, err = pgx.Connect(ctx, again.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var v int
	if err := c.QueryRow(ctx, `SELECT v FROM kept`).Scan(&v); err != nil || v != 7 {
		t.Fatalf("data after securing: %d, %v", v, err)
	}
}

// Run as root, the cluster runs as another user that must reach its data
// directory: a parent it cannot enter is named, with what to change, and
// left as it was.
func TestLocalPostgresChangesNoParentMode(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only root hands the cluster to another user")
	}
	parent := filepath.Join(storetest.DataDir(t), "private")
	if err := os.Mkdir(parent, 0o700); err != nil {
		t.Fatal(err)
	}
	lp := &localpg.Cluster{Dir: filepath.Join(parent, "data", "pg"), WithoutTimescale: true}
	_, err := lp.Start(context.Background())
	if err == nil {
		_ = lp.Stop()
		t.Fatal("started under a directory its user cannot enter")
	}
	if !strings.Contains(err.Error(), "cannot enter "+parent) || !strings.Contains(err.Error(), "chmod o+x "+parent) {
		t.Errorf("error %q; want it to name %s and what to change", err, parent)
	}
	st, _ := os.Stat(parent)
	if st.Mode().Perm() != 0o700 {
		t.Errorf("%s is now %04o; serve changed a directory it did not create", parent, st.Mode().Perm())
	}
}
