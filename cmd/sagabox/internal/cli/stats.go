package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/sagabox/sagabox/cmd/sagabox/internal/view"
	"github.com/sagabox/sagabox/store"
)

// messagingStores returns the store of --schema, checked to have the
// messaging line, or with --all-schemas those of every schema that has
// sagabox tables.
func (a *app) messagingStores(ctx context.Context, pool *pgxpool.Pool, all bool) ([]*store.Store, error) {
	schemas := []string{a.schema}
	if all {
		var err error
		if schemas, err = store.ListSchemas(ctx, pool); err != nil {
			return nil, err
		}
	}
	stores := make([]*store.Store, len(schemas))
	for i, schema := range schemas {
		st, err := store.New(pool, schema)
		if err != nil {
			return nil, withCode(ExitUsage, err)
		}
		if !all {
			if err := a.checkSchema(ctx, st, pool, store.LineMessaging); err != nil {
				return nil, err
			}
		}
		stores[i] = st
	}
	return stores, nil
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
			stores, err := a.messagingStores(cmd.Context(), pool, all)
			if err != nil {
				return err
			}
			out := view.OutboxStatsList{Schemas: []view.OutboxStats{}}
			for _, st := range stores {
				s, err := st.OutboxStats(cmd.Context())
				if err != nil {
					return err
				}
				out.Schemas = append(out.Schemas, view.OutboxStats{Schema: st.Schema(), Backlog: s.Backlog,
					OldestAgeSeconds: s.OldestAge.Seconds(), Retrying: s.Retrying, Dead: s.Dead})
			}
			return a.print(out, func(w io.Writer) {
				fmt.Fprintln(w, "SCHEMA\tBACKLOG\tOLDEST UNSENT\tRETRYING\tDEAD")
				for _, r := range out.Schemas {
					fmt.Fprintf(w, "%s\t%d\t%s\t%d\t%d\n", r.Schema, r.Backlog, fmtDuration(time.Duration(r.OldestAgeSeconds*float64(time.Second))), r.Retrying, r.Dead)
				}
			})
		},
	}
	stats.Flags().BoolVar(&all, "all-schemas", false, "report every schema that has sagabox tables")
	cmd.AddCommand(withJSON(stats), a.outboxDeadCommand(), a.outboxRetryDeadCommand())
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
			if recent <= 0 {
				return withCode(ExitUsage, fmt.Errorf("--recent %s: want a positive duration", recent))
			}
			stores, err := a.messagingStores(cmd.Context(), pool, all)
			if err != nil {
				return err
			}
			out := view.InboxStatsList{Schemas: []view.InboxStats{}}
			for _, st := range stores {
				s, err := st.InboxStats(cmd.Context(), recent)
				if err != nil {
					return err
				}
				out.Schemas = append(out.Schemas, view.InboxStats{Schema: st.Schema(), Processed: s.Total, Duplicates: s.Duplicates,
					DuplicatedMessages: s.DuplicatedMessages, RecentlyDuplicated: s.RecentlyDuplicated, RecentSeconds: recent.Seconds()})
			}
			return a.print(out, func(w io.Writer) {
				fmt.Fprintf(w, "SCHEMA\tPROCESSED\tDUPLICATES\tDUPLICATED MESSAGES\tDUPLICATED IN LAST %s\n", recent)
				for _, r := range out.Schemas {
					fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\n", r.Schema, r.Processed, r.Duplicates, r.DuplicatedMessages, r.RecentlyDuplicated)
				}
			})
		},
	}
	stats.Flags().BoolVar(&all, "all-schemas", false, "report every schema that has sagabox tables")
	stats.Flags().DurationVar(&recent, "recent", time.Hour, "window for recently duplicated messages")
	cmd.AddCommand(withJSON(stats))
	return cmd
}
