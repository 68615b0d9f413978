package main

import (
	"context"
	"errors"
)

// CollectCommand is not built yet.
type CollectCommand struct{}

// Run implements command.
func (c *CollectCommand) Run(ctx context.Context, args []string) error {
	return errors.New("collect: not implemented yet")
}
