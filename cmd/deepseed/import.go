package main

import (
	"context"
	"errors"
)

// ImportCommand is not built yet.
type ImportCommand struct{}

// Run implements command.
func (c *ImportCommand) Run(ctx context.Context, args []string) error {
	return errors.New("import: not implemented yet")
}
