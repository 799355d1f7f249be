package cli

import (
	"fmt"
	"io"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/sagabox/sagabox/cmd/sagabox/internal/view"
	"github.com/sagabox/sagabox/store"
)

func (a *app) migrateCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "migrate", Short: "Apply, revert, list or print schema migrations"}
	var lineFlag string
	lines := func() ([]store.Line, error) {
		if lineFlag == "" || lineFlag == "all" {
			return store.AllLines, nil
		}
		l, err := store.ParseLine(lineFlag)
		if err != nil {
			return nil, withCode(ExitUsage, err)
		}
		return []store.Line{l}, nil
	}
	up := &cobra.Command{
		Use:   "up",
		Short: "Apply pending migrations (safe to run from several processes at once)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ls, err := lines()
			if err != nil {
				return err
			}
			st, pool, err := a.openStore(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			applied, err := st.MigrateUp(cmd.Context(), ls...)
			if err != nil {
				return err
			}
			return a.printMigrations(applied, "applied")
		},
	}
	up.Flags().StringVar(&lineFlag, "line", "all", "migration line: messaging (every service), saga (orchestrator) or all")

	var steps int
	down := &cobra.Command{
		Use:   "down",
		Short: "Revert the newest migrations of one line",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if lineFlag == "" || lineFlag == "all" {
				return withCode(ExitUsage, fmt.Errorf("migrate down needs --line messaging or --line saga"))
			}
			if err := positive("steps", steps); err != nil {
				return err
			}
			ls, err := lines()
			if err != nil {
				return err
			}
			st, pool, err := a.openStore(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			reverted, err := st.MigrateDown(cmd.Context(), ls[0], steps)
			if err != nil {
				return err
			}
			return a.printMigrations(reverted, "reverted")
		},
	}
	down.Flags().StringVar(&lineFlag, "line", "", "migration line to revert: messaging or saga")
	down.Flags().IntVar(&steps, "steps", 1, "number of migrations to revert")

	list := &cobra.Command{
		Use:   "list",
		Short: "List migrations and whether each is applied",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, pool, err := a.openStore(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			states, err := st.MigrationStates(cmd.Context())
			if err != nil {
				return err
			}
			out := view.MigrationList{Schema: a.schema, Migrations: make([]view.Migration, len(states))}
			for i, s := range states {
				out.Migrations[i] = view.Migration{Line: string(s.Line), Version: s.Version, Name: s.Name}
				if s.AppliedAt != nil {
					out.Migrations[i].AppliedAt = s.AppliedAt.UTC()
				}
			}
			return a.print(out, func(w io.Writer) {
				fmt.Fprintln(w, "LINE\tVERSION\tNAME\tAPPLIED")
				for _, r := range out.Migrations {
					applied := "pending"
					if !r.AppliedAt.IsZero() {
						applied = fmtTime(r.AppliedAt)
					}
					fmt.Fprintf(w, "%s\t%d\t%s\t%s\n", r.Line, r.Version, r.Name, applied)
				}
			})
		},
	}

	var downSQL bool
	printCmd := &cobra.Command{
		Use:   "print LINE VERSION",
		Short: "Print a migration's SQL for --schema (for goose, atlas or review)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			line, err := store.ParseLine(args[0])
			if err != nil {
				return withCode(ExitUsage, err)
			}
			version, err := strconv.Atoi(args[1])
			if err != nil {
				return withCode(ExitUsage, fmt.Errorf("version %q is not a number", args[1]))
			}
			st, err := store.New(nil, a.schema)
			if err != nil {
				return withCode(ExitUsage, err)
			}
			sql, err := st.MigrationSQL(line, version, downSQL)
			if err != nil {
				return withCode(ExitNotFound, err)
			}
			_, err = fmt.Fprint(a.stdout, sql)
			return err
		},
	}
	printCmd.Flags().BoolVar(&downSQL, "down", false, "print the down migration")
	cmd.AddCommand(withJSON(up), withJSON(down), withJSON(list), printCmd)
	return cmd
}

func (a *app) printMigrations(migs []store.Migration, verb string) error {
	out := view.MigrationList{Schema: a.schema, Migrations: make([]view.Migration, len(migs))}
	for i, m := range migs {
		out.Migrations[i] = view.Migration{Line: string(m.Line), Version: m.Version, Name: m.Name}
	}
	return a.print(out, func(w io.Writer) {
		if len(out.Migrations) == 0 {
			fmt.Fprintf(w, "schema %s: nothing to do\n", a.schema)
			return
		}
		for _, r := range out.Migrations {
			fmt.Fprintf(w, "schema %s: %s %s %d (%s)\n", a.schema, verb, r.Line, r.Version, r.Name)
		}
	})
}
