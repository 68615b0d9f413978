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
// The suite never skips for want of a database: without PostgreSQL it
// fails and says how to install it.
package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/deepseed/deepseed/store"
)

var (
	mu       sync.Mutex
	adminURL string // a URL of the maintenance database on the server
	template string // a migrated database to clone
	startErr error
)

// Main starts the database server for the package's tests, runs them and
// stops it. Use it as os.Exit(storetest.Main(m)).
func Main(m *testing.M) int {
	var lp *store.LocalPostgres
	if u := os.Getenv("DEEPSEED_TEST_DATABASE_URL"); u != "" {
		adminURL = u
	} else {
		dir, err := os.MkdirTemp("", "deepseed-pg-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "storetest:", err)
			return 1
		}
		defer os.RemoveAll(dir)
		lp = &store.LocalPostgres{Dir: filepath.Join(dir, "pg")}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		u, err := lp.Start(ctx)
		cancel()
		if err != nil {
			fmt.Fprintln(os.Stderr, "storetest: start PostgreSQL:", err)
			return 1
		}
		adminURL = u
	}
	code := m.Run()
	if lp != nil {
		if err := lp.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "storetest:", err)
		}
	}
	return code
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
	tpl := migratedTemplate(t)
	name := "deepseed_test_" + randHex(6)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mustExec(t, ctx, adminURL, fmt.Sprintf(`CREATE DATABASE %s TEMPLATE %s`, name, tpl))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, adminURL)
		if err != nil {
			return
		}
		defer conn.Close(ctx)
		_, _ = conn.Exec(ctx, fmt.Sprintf(`DROP DATABASE IF EXISTS %s WITH (FORCE)`, name))
	})
	return WithDatabase(adminURL, name)
}

// NewStore opens a store on a fresh, migrated database, closed when the
// test ends.
func NewStore(t testing.TB) *store.Store {
	t.Helper()
	u := NewDatabase(t)
	s, err := store.Open(context.Background(), u, nil)
	if err != nil {
		t.Fatalf("storetest: open store: %v", err)
	}
	t.Cleanup(s.Close)
	return s
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
	if template != "" || startErr != nil {
		if startErr != nil {
			t.Fatalf("storetest: %v", startErr)
		}
		return template
	}
	if adminURL == "" {
		t.Fatal("storetest: no database server; call storetest.Main from TestMain")
	}
	name := "deepseed_tpl_" + randHex(6)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	mustExec(t, ctx, adminURL, `CREATE DATABASE `+name)
	s, err := store.Open(ctx, WithDatabase(adminURL, name), nil)
	if err != nil {
		startErr = err
		t.Fatalf("storetest: %v", err)
	}
	if _, err := s.Migrate(ctx); err != nil {
		s.Close()
		startErr = err
		t.Fatalf("storetest: %v", err)
	}
	s.Close()
	template = name
	return template
}

func mustExec(t testing.TB, ctx context.Context, u, sql string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatalf("storetest: connect: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("storetest: %s: %v", sql, err)
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
