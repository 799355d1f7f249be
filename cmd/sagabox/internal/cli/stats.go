package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/sagabox/sagabox/store"
)

// schemas returns --schema, or every sagabox schema with --all-schemas.
func (a *app) schemas(ctx context.Context, pool *pgxpool.Pool, all bool) ([]string, error) {
	if !all {
		return []string{a.schema}, nil
	}
	return store.ListSchemas(ctx, pool)
}

func (a *app) outboxCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "outbox", Short: "Inspect outboxes"}
	var all bool
	stats := &cobra.Command{
		Use:   "stats",
		Short: "Backlog and age of the oldest unpublished message, per service schema",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pool, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			schemas, err := a.schemas(cmd.Context(), pool, all)
			if err != nil {
				return err
			}
			type row struct {
				Schema           string  `json:"schema"`
				Backlog          int64   `json:"backlog"`
				OldestAgeSeconds float64 `json:"oldest_age_seconds"`
				Retrying         int64   `json:"retrying"`
			}
			var rows []row
			for _, schema := range schemas {
				st, err := store.New(pool, schema)
				if err != nil {
					return withCode(ExitUsage, err)
				}
				s, err := st.Executor().OutboxStats(cmd.Context())
				if err != nil {
					return err
				}
				rows = append(rows, row{schema, s.Backlog, s.OldestAge.Seconds(), s.Retrying})
			}
			return a.print(rows, func(w io.Writer) {
				fmt.Fprintln(w, "SCHEMA\tBACKLOG\tOLDEST UNSENT\tRETRYING")
				for _, r := range rows {
					fmt.Fprintf(w, "%s\t%d\t%s\t%d\n", r.Schema, r.Backlog, fmtDuration(time.Duration(r.OldestAgeSeconds*float64(time.Second))), r.Retrying)
				}
			})
		},
	}
	stats.Flags().BoolVar(&all, "all-schemas", false, "report every schema that has sagabox tables")
	cmd.AddCommand(stats, a.outboxDeadCommand(), a.outboxRetryDeadCommand())
	return cmd
}

func (a *app) inboxCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "inbox", Short: "Inspect inboxes"}
	var all bool
	var recent time.Duration
	stats := &cobra.Command{
		Use:   "stats",
		Short: "Processed messages and duplicate deliveries, per service schema",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pool, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			schemas, err := a.schemas(cmd.Context(), pool, all)
			if err != nil {
				return err
			}
			type row struct {
				Schema             string `json:"schema"`
				Processed          int64  `json:"processed"`
				Duplicates         int64  `json:"duplicates"`
				DuplicatedMessages int64  `json:"duplicated_messages"`
				RecentlyDuplicated int64  `json:"recently_duplicated"`
			}
			var rows []row
			for _, schema := range schemas {
				st, err := store.New(pool, schema)
				if err != nil {
					return withCode(ExitUsage, err)
				}
				s, err := st.Executor().InboxStats(cmd.Context(), recent)
				if err != nil {
					return err
				}
				rows = append(rows, row{schema, s.Total, s.Duplicates, s.DuplicatedMessages, s.RecentlyDuplicated})
			}
			return a.print(rows, func(w io.Writer) {
				fmt.Fprintf(w, "SCHEMA\tPROCESSED\tDUPLICATES\tDUPLICATED MESSAGES\tDUPLICATED IN LAST %s\n", recent)
				for _, r := range rows {
					fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\n", r.Schema, r.Processed, r.Duplicates, r.DuplicatedMessages, r.RecentlyDuplicated)
				}
			})
		},
	}
	stats.Flags().BoolVar(&all, "all-schemas", false, "report every schema that has sagabox tables")
	stats.Flags().DurationVar(&recent, "recent", time.Hour, "window for recently duplicated messages")
	cmd.AddCommand(stats)
	return cmd
}
