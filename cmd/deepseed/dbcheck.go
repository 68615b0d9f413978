package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/deepseed/deepseed/internal/localpg"
)

// Checks made before serve or migrate sets anything up, so that a wrong
// host or a taken port is said in one line at once, rather than after a
// private cluster was initialised or in a wait that never ends.

// checkListen reports a --listen address that another process holds.
func checkListen(cmd, addr string) error {
	l, err := net.Listen("tcp", addr)
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("%s: --listen %s is taken by another process (another deepseed serve?): stop it or give another --listen (DEEPSEED_LISTEN)", cmd, addr)
	}
	if err != nil {
		return nil // the server says what else is wrong with it
	}
	return l.Close()
}

// dbHosts are the host:port pairs of a database URL, without anything
// else of the URL (which may hold a password). Unix sockets are left out.
func dbHosts(url string) []string {
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return nil
	}
	var out []string
	add := func(host string, port uint16) {
		// pgconn repeats a host for each TLS mode it tries.
		if hp := net.JoinHostPort(host, strconv.Itoa(int(port))); !strings.HasPrefix(host, "/") && !slices.Contains(out, hp) {
			out = append(out, hp)
		}
	}
	add(cfg.Host, cfg.Port)
	for _, fb := range cfg.Fallbacks {
		add(fb.Host, fb.Port)
	}
	return out
}

// checkDBHosts refuses a database URL none of whose hosts resolves: a
// server that is down is waited for, a name that does not exist never
// comes up. A resolver that does not answer is not taken as a no.
func checkDBHosts(ctx context.Context, cmd, flag, url string) error {
	hosts := dbHosts(url)
	if len(hosts) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	var missing []string
	for _, hp := range hosts {
		host, _, _ := net.SplitHostPort(hp)
		if slices.Contains(missing, host) {
			continue
		}
		_, err := net.DefaultResolver.LookupHost(ctx, host)
		var dns *net.DNSError
		if err == nil || !errors.As(err, &dns) || !dns.IsNotFound {
			return nil
		}
		missing = append(missing, host)
	}
	return fmt.Errorf("%s: the database host %s in --%s does not resolve: check the host name in the URL", cmd, strings.Join(missing, ", "), flag)
}

// dbUnreachable describes a failed connection to the database in one
// line, naming the host and port but not the rest of the URL; it returns
// nil for other errors.
func dbUnreachable(cmd, url string, err error) error {
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) {
		return nil
	}
	where := strings.Join(dbHosts(url), ", ")
	if where == "" {
		where = "the database"
	}
	var dns *net.DNSError
	var reason string
	switch {
	case errors.As(err, &dns):
		reason = fmt.Sprintf("the host %q does not resolve", dns.Name)
	case errors.Is(err, syscall.ECONNREFUSED):
		reason = "nothing listens there (connection refused)"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, syscall.ETIMEDOUT):
		reason = "no answer in time"
	default:
		return nil // a refused login, a missing database: the store says those
	}
	return fmt.Errorf("%s: cannot reach the database at %s: %s; is PostgreSQL running there, and is --database-url (DEEPSEED_DATABASE_URL) right?", cmd, where, reason)
}

// localPGError says what to do when the private PostgreSQL cannot start
// because its port is taken.
func localPGError(cmd string, port int, err error) error {
	if errors.Is(err, localpg.ErrPortTaken) {
		return fmt.Errorf("%s: the private PostgreSQL's port %d on 127.0.0.1 is taken by another process (a PostgreSQL, or another deepseed serve with another --data-dir): give another --local-pg-port (DEEPSEED_LOCAL_PG_PORT), or --database-url to use that PostgreSQL", cmd, port)
	}
	return err
}
