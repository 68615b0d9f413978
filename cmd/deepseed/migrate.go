package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/deepseed/deepseed/store"
)

// MigrateCommand applies pending migrations and exits.
type MigrateCommand struct{}

// Run implements command.
func (c *MigrateCommand) Run(ctx context.Context, args []string) error {
	f := newEnvFlags("migrate")
	db := addDBFlags(f)
	f.setUsage("deepseed migrate [flags]", `
Apply every pending migration of the schema and exit. Each migration runs
once, in a transaction; several servers or migrate commands starting at once
wait for each other. Where the timescaledb extension is installed and
preloaded, the time-series tables also become hypertables with the
compression given here; where it is not, the database stays plain
PostgreSQL and the log says why (--timescale=require makes that an error).
"deepseed serve" does the same at start, and applies --retention.`, "")
	if err := f.parse(args); err != nil {
		return err
	}
	if f.fs.NArg() > 0 {
		f.fs.Usage()
		return errors.New("migrate: takes no arguments")
	}
	dbc, errs := db.parse("migrate", os.Stderr)
	if len(errs) > 0 {
		return configError("migrate", errs)
	}
	if err := checkDBHosts(ctx, "migrate", "database-url", dbc.databaseURL); err != nil {
		return err
	}
	st, closeDB, err := openDatabase(ctx, dbc)
	if err != nil {
		return err
	}
	defer closeDB()
	applied, err := st.Migrate(ctx)
	if why := store.NeedsOperator(err); why != "" {
		return fmt.Errorf("migrate: database: %s", why)
	}
	if e := dbUnreachable("migrate", dbc.databaseURL, err); e != nil {
		return e
	}
	if err != nil {
		return err // "migrate: …"
	}
	dbMode, err := st.SetupMode(ctx, dbc.timescale, store.TimescaleOptions{CompressAfter: dbc.compressAfter})
	if err != nil {
		return err // "migrate: …"
	}
	mode := dbMode.String()
	if dbMode.Why != "" {
		dbc.log.Info("database mode: plain PostgreSQL", "why", dbMode.Why)
	}
	dbc.log.Info("database up to date", "applied", len(applied), "mode", mode)
	fmt.Printf("applied %d migration(s); database mode: %s\n", len(applied), mode)
	return nil
}
