package main

import (
	"context"
	"errors"
)

// ServeCommand is not built yet.
type ServeCommand struct{}

// Run implements command.
func (c *ServeCommand) Run(ctx context.Context, args []string) error {
	return errors.New("serve: not implemented yet")
}
