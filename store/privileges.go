package store

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/sagabox/sagabox/store/internal/dbsqlc"
)

// PrivilegeOpts says what a role's part is, for CheckPrivileges and
// GrantsSQL. The zero value is a client's runtime role with the polling
// relay.
type PrivilegeOpts struct {
	// ReadOnly is the part of the console's read-only mode, of `sagabox`'s
	// inspection commands and of dashboards: SELECT on the schema's tables
	// and views, EXECUTE on its functions, nothing written. Otherwise the
	// role is a client's runtime role: SELECT, INSERT, UPDATE and DELETE on
	// the schema's tables (SELECT only on the migration table), SELECT on
	// its views, EXECUTE on its functions, USAGE on its sequences.
	ReadOnly bool
	// LogRelay adds the REPLICATION attribute, which a relay in log mode
	// needs to stream the outbox's inserts from its replication slot.
	LogRelay bool
}

// CheckPrivileges returns an error wrapping ErrInsufficientPrivilege that
// lists the GRANTs the role the store connects as lacks for its part (o;
// nil is a runtime role with the polling relay) in the store's schema,
// and nil when it lacks none. The clients call it when they start, so that
// a missing grant fails the start with the statement that fixes it rather
// than the first message the role is refused for. It checks sagabox's
// objects only (tables, views and functions named sagabox_*), and nothing
// in a schema that does not exist or is not migrated yet: CheckSchema
// reports that. A superuser lacks nothing.
//
// A connection that fails because TLS did not verify the server's
// certificate is reported as ExplainCertificate does, as a final error (not
// one that IsConnectionError calls a connection error): waiting does not
// make a certificate verify.
func (s *Store) CheckPrivileges(ctx context.Context, o *PrivilegeOpts) error {
	if o == nil {
		o = &PrivilegeOpts{}
	}
	db, err := s.pooled()
	if err != nil {
		return err
	}
	role, err := s.queries.PrivilegeRole(ctx, db, s.schema)
	if err != nil {
		return s.privilegeQueryError(err)
	}
	if !role.SchemaExists {
		return nil
	}
	missing, err := s.queries.PrivilegeMissing(ctx, db, &dbsqlc.PrivilegeMissingParams{Schema: s.schema, ReadOnly: o.ReadOnly})
	if err != nil {
		return s.privilegeQueryError(err)
	}
	var grants []string
	to := " TO " + pgx.Identifier{role.Role}.Sanitize()
	schema := pgx.Identifier{s.schema}.Sanitize()
	if !role.SchemaUsage {
		grants = append(grants, "GRANT USAGE ON SCHEMA "+schema+to)
	}
	// One GRANT per object, with its privileges in the order GRANT is
	// usually written.
	rank := map[string]int{"SELECT": 0, "INSERT": 1, "UPDATE": 2, "DELETE": 3}
	sort.SliceStable(missing, func(i, j int) bool {
		if missing[i].Object != missing[j].Object {
			return missing[i].Object < missing[j].Object
		}
		return rank[missing[i].Privilege] < rank[missing[j].Privilege]
	})
	type object struct{ kind, name string }
	var order []object
	privs := map[object][]string{}
	for _, m := range missing {
		obj := object{m.Kind, m.Object}
		if _, seen := privs[obj]; !seen {
			order = append(order, obj)
		}
		privs[obj] = append(privs[obj], m.Privilege)
	}
	for _, obj := range order {
		switch obj.kind {
		case "function":
			// The name carries its argument types: sagabox_check(boolean, text, text).
			grants = append(grants, "GRANT EXECUTE ON FUNCTION "+schema+"."+obj.name+to)
		default:
			grants = append(grants, fmt.Sprintf("GRANT %s ON %s.%s%s", strings.Join(privs[obj], ", "), schema, pgx.Identifier{obj.name}.Sanitize(), to))
		}
	}
	if o.LogRelay && !role.Replication {
		grants = append(grants, "ALTER ROLE "+pgx.Identifier{role.Role}.Sanitize()+" REPLICATION")
	}
	if len(grants) == 0 {
		return nil
	}
	part := "a runtime role"
	flags := ""
	if o.ReadOnly {
		part, flags = "a read-only role", " --read-only"
	}
	if o.LogRelay {
		part, flags = part+" with the log relay", flags+" --log-relay"
	}
	return fmt.Errorf("%w: role %q lacks what %s needs in schema %q; as the schema's owner run:\n  %s;\n"+
		"(every grant of the role: sagabox roles print --schema %s --role %s%s)",
		ErrInsufficientPrivilege, role.Role, part, s.schema, strings.Join(grants, ";\n  "), s.schema, role.Role, flags)
}

// privilegeQueryError is the error of CheckPrivileges' queries: a
// certificate that did not verify is explained and final.
func (s *Store) privilegeQueryError(err error) error {
	if isCertificateError(err) {
		return fmt.Errorf("check the privileges in schema %q: %s", s.schema, ExplainCertificate(s.pool.Config().ConnString(), err).Error())
	}
	return fmt.Errorf("check the privileges in schema %q: %w", s.schema, err)
}
