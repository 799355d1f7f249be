package store

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// GrantOpts says whom GrantsSQL grants to, on which schema and for what.
type GrantOpts struct {
	PrivilegeOpts
	// Schema is the service's schema. Defaults to DefaultSchema.
	Schema string
	// Role is the role that gets the grants. Required.
	Role string
	// Owner is the role that owns the schema and runs its migrations: the
	// default privileges are set for the objects it creates later. Defaults
	// to none: they are set for the objects of the role that runs the
	// statements, which should then be the owner.
	Owner string
	// Database, when set, adds the CONNECT privilege on that database.
	// Defaults to none (PUBLIC has it unless it was revoked).
	Database string
}

// maxIdentifier is PostgreSQL's longest identifier, in bytes.
const maxIdentifier = 63

func validRole(field, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%s is required", field)
	case len(name) > maxIdentifier:
		return fmt.Errorf("%s %q is longer than %d bytes", field, name, maxIdentifier)
	case strings.ContainsRune(name, 0):
		return fmt.Errorf("%s contains a NUL byte", field)
	}
	return nil
}

// GrantsSQL returns the SQL that gives o.Role its part in o.Schema under
// sagabox's role layout (docs/operations.md, "Security"), with every
// identifier quoted:
//
//   - a runtime role (the default) may use the schema, read and write its
//     tables (only read the migration table), read its views, use its
//     sequences and run its functions, and so may it on the tables,
//     sequences and functions the owner creates later; it creates nothing
//     and is granted nothing in any other schema;
//   - a read-only role (o.ReadOnly) may only read the schema's tables and
//     views, and run its functions;
//   - o.LogRelay adds the REPLICATION attribute a relay in log mode needs.
//
// Run it as the schema's owner (or a superuser) after the migrations: it
// names the migration table. It creates no role and holds no password.
func GrantsSQL(o GrantOpts) (string, error) {
	if o.Schema == "" {
		o.Schema = DefaultSchema
	}
	var errs []error
	if err := ValidateSchema(o.Schema); err != nil {
		errs = append(errs, err)
	}
	if err := validRole("role", o.Role); err != nil {
		errs = append(errs, err)
	}
	if o.Owner != "" {
		if err := validRole("owner", o.Owner); err != nil {
			errs = append(errs, err)
		}
	}
	if o.Database != "" {
		if err := validRole("database", o.Database); err != nil {
			errs = append(errs, err)
		}
	}
	if o.ReadOnly && o.LogRelay {
		errs = append(errs, errors.New("a read-only role relays nothing: drop the log relay or read-only"))
	}
	if len(errs) > 0 {
		return "", fmt.Errorf("store: grants: %w", errors.Join(errs...))
	}
	role := pgx.Identifier{o.Role}.Sanitize()
	schema := pgx.Identifier{o.Schema}.Sanitize()
	defaults := "ALTER DEFAULT PRIVILEGES IN SCHEMA " + schema
	if o.Owner != "" {
		defaults = "ALTER DEFAULT PRIVILEGES FOR ROLE " + pgx.Identifier{o.Owner}.Sanitize() + " IN SCHEMA " + schema
	}
	var b strings.Builder
	line := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	if o.ReadOnly {
		line("-- sagabox read-only role %s for schema %s: reads its tables and views (the console's", role, schema)
		line("-- read-only mode, `sagabox` inspection commands, dashboards over the sagabox_*_v views);")
		line("-- writes nothing, creates nothing.")
	} else {
		line("-- sagabox runtime role %s for schema %s: reads and writes its tables, reads its views,", role, schema)
		line("-- uses its sequences, runs its functions; creates nothing, reads no other schema.")
	}
	line("-- Run as the schema's owner (or a superuser) after `sagabox migrate up --schema %s`.", o.Schema)
	line("-- The role must exist: CREATE ROLE %s LOGIN PASSWORD '…' (never printed here).", role)
	if o.Database != "" {
		line("GRANT CONNECT ON DATABASE %s TO %s;", pgx.Identifier{o.Database}.Sanitize(), role)
	}
	line("GRANT USAGE ON SCHEMA %s TO %s;", schema, role)
	if o.ReadOnly {
		line("GRANT SELECT ON ALL TABLES IN SCHEMA %s TO %s;", schema, role)
		line("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA %s TO %s;", schema, role)
		line("-- What the owner creates later (new migrations, new tables) can be read too.")
		line("%s GRANT SELECT ON TABLES TO %s;", defaults, role)
		line("%s GRANT EXECUTE ON FUNCTIONS TO %s;", defaults, role)
		return b.String(), nil
	}
	line("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA %s TO %s;", schema, role)
	line("-- The migration history is the owner's: the schema version check only reads it.")
	line("REVOKE INSERT, UPDATE, DELETE ON %s FROM %s;", pgx.Identifier{o.Schema, "sagabox_migration"}.Sanitize(), role)
	line("GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA %s TO %s;", schema, role)
	line("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA %s TO %s;", schema, role)
	line("-- What the owner creates later (new migrations, new tables) gets the same grants.")
	line("%s GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO %s;", defaults, role)
	line("%s GRANT USAGE, SELECT ON SEQUENCES TO %s;", defaults, role)
	line("%s GRANT EXECUTE ON FUNCTIONS TO %s;", defaults, role)
	if o.LogRelay {
		line("-- The log relay streams the outbox's inserts from its replication slot. The slot and the")
		line("-- publication are the owner's: `sagabox relay setup-log --schema %s` (REPLICATION too).", o.Schema)
		line("-- Only a superuser may give the attribute.")
		line("ALTER ROLE %s REPLICATION;", role)
	}
	return b.String(), nil
}
