package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/sagabox/sagabox/store"
)

func (a *app) rolesCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "roles", Short: "Print the grants of sagabox's role layout (least privilege per service)"}
	var o store.GrantOpts
	printCmd := &cobra.Command{
		Use:   "print --schema SCHEMA --role ROLE [--read-only] [--log-relay]",
		Short: "Print the GRANTs that give ROLE its part in --schema: a service's runtime role, or a read-only role",
		Long: `Prints SQL that gives --role its part in the service schema --schema, every identifier quoted:

  runtime role (default)  reads and writes the schema's tables (only reads the migration table),
                          reads its views, uses its sequences, runs its functions; creates nothing
                          and is granted nothing in another schema. One per service.
  --read-only             reads the schema's tables and views: the console's read-only mode,
                          sagabox's inspection commands, dashboards over the sagabox_*_v views.
  --log-relay             adds the REPLICATION attribute a relay in log mode needs.

Run the SQL as the schema's owner (the role that runs sagabox migrate up) or a superuser, after
the migrations, e.g. sagabox roles print --schema inventory --role inventory_app | psql "$OWNER_URL".
It creates no role and never holds a password. The layout: docs/operations.md, "Security".`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Schema = a.schema
			sql, err := store.GrantsSQL(o)
			if err != nil {
				return withCode(ExitUsage, err)
			}
			_, err = fmt.Fprint(a.stdout, sql)
			return err
		},
	}
	printCmd.Flags().StringVar(&o.Role, "role", "", "the role to grant to (required)")
	printCmd.Flags().BoolVar(&o.ReadOnly, "read-only", false, "a read-only role: SELECT only")
	printCmd.Flags().BoolVar(&o.LogRelay, "log-relay", false, "the role runs a relay in log mode: add REPLICATION")
	printCmd.Flags().StringVar(&o.Owner, "owner", "", "the schema's owner, for the default privileges of what it creates later (default: the role running the SQL)")
	printCmd.Flags().StringVar(&o.Database, "database", "", "also grant CONNECT on this database")
	cmd.AddCommand(printCmd)
	return cmd
}
