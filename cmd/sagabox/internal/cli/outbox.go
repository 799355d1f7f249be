package cli

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/sagabox/sagabox/cmd/sagabox/internal/view"
	"github.com/sagabox/sagabox/store"
)

func (a *app) outboxDeadCommand() *cobra.Command {
	var limit int
	cmd := &cobra.Command{
		Use:   "dead",
		Short: "List outbox messages the relay gave up on (replies and events no queue takes), most recent first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := positive("limit", limit); err != nil {
				return err
			}
			st, pool, err := a.openStore(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			if err := a.checkSchema(cmd.Context(), st, pool, store.LineMessaging); err != nil {
				return err
			}
			dead, err := st.DeadRows(cmd.Context(), nil, limit)
			if err != nil {
				return err
			}
			out := view.DeadOutboxList{Schema: a.schema, Messages: make([]view.DeadOutboxMessage, len(dead))}
			for i, d := range dead {
				out.Messages[i] = view.DeadOutboxMessage{
					ID: d.ID, MessageID: d.Message.MessageID, Kind: string(d.Message.Kind), Type: d.Message.Type, SagaID: d.Message.SagaID,
					RoutingKey: d.Message.RoutingKey, PublishAttempts: d.PublishAttempts, Reason: d.Reason, DeadAt: d.DeadAt.UTC(),
				}
			}
			return a.print(out, func(w io.Writer) {
				fmt.Fprintln(w, "ID\tKIND\tTYPE\tROUTING KEY\tATTEMPTS\tDEAD SINCE\tREASON")
				for _, r := range out.Messages {
					fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%d\t%s\t%s\n", r.ID, r.Kind, r.Type, r.RoutingKey, r.PublishAttempts, r.DeadAt.Format(time.RFC3339), r.Reason)
				}
			})
		},
	}
	cmd.Flags().IntVar(&limit, "limit", 100, "most rows to list")
	return withJSON(cmd)
}

func (a *app) outboxRetryDeadCommand() *cobra.Command {
	var ids []int64
	var drop bool
	cmd := &cobra.Command{
		Use:   "retry-dead",
		Short: "Publish dead outbox messages again (after fixing what made them unroutable), or delete them with --delete",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(ids) == 0 {
				return withCode(ExitUsage, errors.New("--id is required (the ids `sagabox outbox dead` lists)"))
			}
			st, pool, err := a.openStore(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			if err := a.checkSchema(cmd.Context(), st, pool, store.LineMessaging); err != nil {
				return err
			}
			var n int64
			verb := "made unpublished again (the relay publishes them)"
			if drop {
				n, err = st.DeleteDeadRows(cmd.Context(), ids)
				verb = "deleted"
			} else {
				n, err = st.RetryDeadRows(cmd.Context(), ids)
			}
			if err != nil {
				return err
			}
			out := view.DeadOutboxRetry{Schema: a.schema, Requested: len(ids), Matched: n, Deleted: drop}
			if err := a.print(out, func(w io.Writer) { fmt.Fprintf(w, "%d of %d dead messages %s\n", n, len(ids), verb) }); err != nil {
				return err
			}
			if n < int64(len(ids)) {
				return withCode(ExitNotFound, fmt.Errorf("%d of the %d ids are not dead outbox rows of schema %s", int64(len(ids))-n, len(ids), a.schema))
			}
			return nil
		},
	}
	cmd.Flags().Int64SliceVar(&ids, "id", nil, "outbox row id (repeat or comma-separate)")
	cmd.Flags().BoolVar(&drop, "delete", false, "delete the rows instead of publishing them again")
	return withJSON(cmd)
}
