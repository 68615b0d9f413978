// Package migrations holds the ordered SQL files of the schema, embedded
// in the binary. File names start with a zero-padded sequence number;
// each file is applied once, inside a transaction, and recorded in the
// schema_migrations table.
package migrations

import "embed"

// FS holds the migration files.
//
//go:embed *.sql
var FS embed.FS
