package main

import (
	"context"
	"errors"
)

// MigrateCommand is not built yet.
type MigrateCommand struct{}

// Run implements command.
func (c *MigrateCommand) Run(ctx context.Context, args []string) error {
	return errors.New("migrate: not implemented yet")
}
