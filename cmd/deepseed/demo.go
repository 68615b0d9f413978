package main

import (
	"context"
	"errors"
)

// DemoCommand is not built yet.
type DemoCommand struct{}

// Run implements command.
func (c *DemoCommand) Run(ctx context.Context, args []string) error {
	return errors.New("demo: not implemented yet")
}
