package main

import (
	"context"
	"errors"
)

// BenchCommand is not built yet.
type BenchCommand struct{}

// Run implements command.
func (c *BenchCommand) Run(ctx context.Context, args []string) error {
	return errors.New("bench: not implemented yet")
}
