// Package storetest gives tests a real, migrated PostgreSQL database.
//
// Usage:
//  1. In the package's TestMain: os.Exit(storetest.Main(m)).
//  2. In a test: url := storetest.NewDatabase(t) — a fresh database with
//     every migration applied, dropped when the test ends.
//
// When DEEPSEED_TEST_DATABASE_URL is set, databases are created on that
// server; otherwise Main starts a throwaway cluster from the machine's
// PostgreSQL binaries in a temporary directory and removes it afterwards.
// Where TimescaleDB is available (see DEEPSEED_TEST_TIMESCALE below) the
// template is set up as DeepSeed sets up a TimescaleDB database, so every
// test runs on hypertables; Main says on stderr which mode it is.
// The suite never skips for want of a database: without PostgreSQL it
// fails and says how to install it.
package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/deepseed/deepseed/internal/localpg"
	"github.com/deepseed/deepseed/store"
)

var (
	mu       sync.Mutex
	adminURL string // a URL of the maintenance database on the server
	template string // a migrated database to clone
	mode     store.DatabaseMode
	startErr error
)

// timescaleEnv chooses the database mode of the tests: auto (the default)
// uses TimescaleDB where the server has it (for the throwaway cluster:
// where the machine's PostgreSQL has the extension, which is then
// preloaded), require fails without it, off keeps it out of the
// throwaway cluster and the template.
const timescaleEnv = "DEEPSEED_TEST_TIMESCALE"

// Main starts the database server for the package's tests, prepares the
// migrated template, says on stderr which database mode the tests run
// in, runs them and stops the server. Use it as os.Exit(storetest.Main(m)).
func Main(m *testing.M) int {
	want := os.Getenv(timescaleEnv)
	switch want {
	case "":
		want = store.TimescaleAuto
	case store.TimescaleAuto, store.TimescaleRequire, "off":
	default:
		fmt.Fprintf(os.Stderr, "storetest: %s=%s: want auto, require or off\n", timescaleEnv, want)
		return 1
	}
	var lp *localpg.Cluster
	if u := os.Getenv("DEEPSEED_TEST_DATABASE_URL"); u != "" {
		adminURL = u
	} else {
		dir, err := os.MkdirTemp("", "deepseed-pg-")
		if err == nil {
			err = reachable(dir)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "storetest:", err)
			return 1
		}
		defer os.RemoveAll(dir)
		lp = &localpg.Cluster{Dir: filepath.Join(dir, "pg"), WithoutTimescale: want == "off",
			// TimescaleDB's job scheduler would start one background worker
			// per test database; the tests run no TimescaleDB job.
			Settings: map[string]string{"timescaledb.max_background_workers": "0"}}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		u, err := lp.Start(ctx)
		cancel()
		if err != nil {
			fmt.Fprintln(os.Stderr, "storetest: start PostgreSQL:", err)
			return 1
		}
		adminURL = u
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	template, mode, startErr = makeTemplate(ctx, want)
	cancel()
	if startErr != nil {
		fmt.Fprintln(os.Stderr, "storetest:", startErr)
	} else {
		fmt.Fprintln(os.Stderr, "storetest: database mode:", mode)
	}
	code := m.Run()
	if template != "" && lp == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		for _, db := range exampleDBs {
			if err := execSQL(ctx, adminURL, `DROP DATABASE IF EXISTS `+db+` WITH (FORCE)`); err != nil {
				fmt.Fprintln(os.Stderr, "storetest: drop example database:", err)
			}
		}
		if err := execSQL(ctx, adminURL, `DROP DATABASE IF EXISTS `+template+` WITH (FORCE)`); err != nil {
			fmt.Fprintln(os.Stderr, "storetest: drop template:", err)
		}
		cancel()
	}
	if lp != nil {
		if err := lp.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "storetest:", err)
		}
	}
	return code
}

// Mode returns the database mode of the tests: plain PostgreSQL, or
// TimescaleDB with the template's tables set up as hypertables.
func Mode(t testing.TB) store.DatabaseMode {
	t.Helper()
	migratedTemplate(t)
	return mode
}

// AdminURL returns the URL of the server's maintenance database, for tests
// that create or break databases themselves.
func AdminURL(t testing.TB) string {
	t.Helper()
	if adminURL == "" {
		t.Fatal("storetest: no database server; call storetest.Main from TestMain")
	}
	return adminURL
}

// NewDatabase creates a fresh, migrated database and returns its URL. The
// database is dropped when the test ends.
func NewDatabase(t testing.TB) string {
	t.Helper()
	return NewDatabaseIn(t, "")
}

// NewDatabaseIn is NewDatabase with the database's files in tablespace
// (the server's default when ""), for tests that fill its disk.
func NewDatabaseIn(t testing.TB, tablespace string) string {
	t.Helper()
	migratedTemplate(t)
	name := "deepseed_test_" + randHex(6)
	if err := createFromTemplate(name, tablespace); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = execSQL(ctx, adminURL, fmt.Sprintf(`DROP DATABASE IF EXISTS %s WITH (FORCE)`, name))
	})
	return WithDatabase(adminURL, name)
}

// ExampleDatabase creates a fresh, migrated database for a runnable
// example, which has no test to own it, and returns its URL; Main drops
// the server's databases when the package's tests end (a throwaway
// cluster goes whole). It panics when Main started no database server.
func ExampleDatabase() string {
	if adminURL == "" || template == "" {
		panic(fmt.Sprintf("storetest: no database server (call storetest.Main from TestMain): %v", startErr))
	}
	name := "deepseed_example_" + randHex(6)
	if err := createFromTemplate(name, ""); err != nil {
		panic(err)
	}
	exampleDBs = append(exampleDBs, name)
	return WithDatabase(adminURL, name)
}

// createFromTemplate creates database name as a copy of the migrated
// template, its files in tablespace (the server's default when "").
func createFromTemplate(name, tablespace string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	create := fmt.Sprintf(`CREATE DATABASE %s TEMPLATE %s`, name, template)
	if tablespace != "" {
		create += " TABLESPACE " + tablespace
	}
	if err := execSQL(ctx, adminURL, create); err != nil {
		return fmt.Errorf("storetest: create database %s: %w", name, err)
	}
	return nil
}

// exampleDBs are the databases ExampleDatabase made, dropped by Main.
var exampleDBs []string

// NewStore opens a store on a fresh, migrated database, closed when the
// test ends. Its Timescale field follows the database mode.
func NewStore(t testing.TB) *store.Store {
	t.Helper()
	u := NewDatabase(t)
	s, err := store.Open(context.Background(), u, nil)
	if err != nil {
		t.Fatalf("storetest: open store: %v", err)
	}
	s.Timescale = mode.Timescale
	t.Cleanup(s.Close)
	storeURLs.Store(s, u)
	t.Cleanup(func() { storeURLs.Delete(s) })
	return s
}

// Open opens a store on the database at url with logger log (nil:
// discard), closed when the test ends, for tests that make their database
// themselves; Pool knows its URL. Its Timescale field is left false, as
// store.Open leaves it.
func Open(t testing.TB, url string, log *slog.Logger) *store.Store {
	t.Helper()
	s, err := store.Open(context.Background(), url, log)
	if err != nil {
		t.Fatalf("storetest: open store: %v", err)
	}
	t.Cleanup(s.Close)
	storeURLs.Store(s, url)
	t.Cleanup(func() { storeURLs.Delete(s) })
	return s
}

// storeURLs holds the URL of each store NewStore or Open opened, for Pool.
var storeURLs sync.Map // *store.Store → string

// pools holds the pools Pool opened, by test and URL.
var pools sync.Map // poolKey → *pgxpool.Pool

type poolKey struct {
	t   testing.TB
	url string
}

// Pool returns a pool of the test's own on a database, closed when the
// test ends, for tests that set up or check rows with SQL the store does
// not offer. db is the database's URL, or a store NewStore or Open opened. The
// same test and database get the same pool.
func Pool[D string | *store.Store](t testing.TB, db D) *pgxpool.Pool {
	t.Helper()
	var u string
	switch v := any(db).(type) {
	case string:
		u = v
	case *store.Store:
		got, ok := storeURLs.Load(v)
		if !ok {
			t.Fatal("storetest: Pool of a store neither NewStore nor Open opened: pass its URL instead")
		}
		u = got.(string)
	}
	key := poolKey{t, u}
	if p, ok := pools.Load(key); ok {
		return p.(*pgxpool.Pool)
	}
	p, err := pgxpool.New(context.Background(), u)
	if err != nil {
		t.Fatalf("storetest: open pool: %v", err)
	}
	if prev, loaded := pools.LoadOrStore(key, p); loaded {
		p.Close()
		return prev.(*pgxpool.Pool)
	}
	t.Cleanup(func() {
		pools.Delete(key)
		p.Close()
	})
	return p
}

// WithDatabase returns u with its database name replaced by db.
func WithDatabase(u, db string) string {
	p, err := url.Parse(u)
	if err != nil {
		return u
	}
	p.Path = "/" + db
	return p.String()
}

func migratedTemplate(t testing.TB) string {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	if adminURL == "" {
		t.Fatal("storetest: no database server; call storetest.Main from TestMain")
	}
	if startErr != nil {
		t.Fatalf("storetest: %v", startErr)
	}
	return template
}

// makeTemplate creates a database, migrates it, sets TimescaleDB up in it
// unless want is off, and closes it to connections, so that CREATE
// DATABASE … TEMPLATE never finds another session in it (TimescaleDB's
// job scheduler connects to every database that has the extension).
func makeTemplate(ctx context.Context, want string) (string, store.DatabaseMode, error) {
	name := "deepseed_tpl_" + randHex(6)
	if err := execSQL(ctx, adminURL, `CREATE DATABASE `+name); err != nil {
		return "", store.DatabaseMode{}, err
	}
	s, err := store.Open(ctx, WithDatabase(adminURL, name), nil)
	if err != nil {
		return "", store.DatabaseMode{}, err
	}
	var m store.DatabaseMode
	if _, err = s.Migrate(ctx); err == nil && want != "off" {
		m, err = s.SetupMode(ctx, want, store.TimescaleOptions{})
	}
	if err == nil && m.Timescale {
		// The clones inherit the template's TimescaleDB jobs. Paused, they
		// do not compress chunks under a test's feet (the tests write data
		// dated years back, which the compression policy takes at once,
		// and a batch racing it deadlocks); a test that wants them runs
		// them itself.
		err = execSQL(ctx, WithDatabase(adminURL, name), `SELECT alter_job(job_id, scheduled => false) FROM timescaledb_information.jobs
			WHERE hypertable_schema = current_schema()`)
	}
	s.Close()
	if err != nil {
		return "", m, fmt.Errorf("template %s: %w", name, err)
	}
	if err := execSQL(ctx, adminURL, `ALTER DATABASE `+name+` WITH ALLOW_CONNECTIONS false`); err != nil {
		return "", m, err
	}
	if err := execSQL(ctx, adminURL, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE datname = '`+name+`' AND pid <> pg_backend_pid()`); err != nil {
		return "", m, err
	}
	return name, m, nil
}

func execSQL(ctx context.Context, u, sql string) error {
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("%s: %w", sql, err)
	}
	return nil
}

func mustExec(t testing.TB, ctx context.Context, u, sql string) {
	t.Helper()
	if err := execSQL(ctx, u, sql); err != nil {
		t.Fatalf("storetest: %v", err)
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// DataDir returns a new temporary directory to hold the data directory of
// a private PostgreSQL cluster, removed when the test ends. Run as root,
// the cluster runs as another user, which must be able to enter it (and
// localpg.Cluster changes no directory it did not create): the test made
// these, so it opens them to that user.
func DataDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := reachable(d); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// reachable lets every user enter dir (not list it), so the cluster's
// user reaches the data directory under it.
func reachable(dir string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		return fmt.Errorf("storetest: %w", err)
	}
	return nil
}
