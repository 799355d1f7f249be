package cli

import (
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/sagabox/sagabox/cmd/sagabox/internal/view"
	"github.com/sagabox/sagabox/orchestrator"
)

func (a *app) opsCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "ops", Short: "List and cancel operator requests (saga retry, cancel, terminate, restart) waiting for an orchestrator"}
	var all bool
	var limit int
	list := &cobra.Command{
		Use:   "list",
		Short: "Pending operator requests, oldest first (--all: every request, newest first)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := positive("limit", limit); err != nil {
				return err
			}
			c, _, closeDB, err := a.client(cmd.Context())
			if err != nil {
				return err
			}
			defer closeDB()
			ops, err := c.ListRequests(cmd.Context(), &orchestrator.ListRequestsOpts{All: all, Limit: limit})
			if err != nil {
				return err
			}
			out := view.OperationList{Schema: a.schema, Operations: make([]view.Operation, len(ops))}
			for i := range ops {
				out.Operations[i] = view.OperationOf(&ops[i])
			}
			return a.print(out, func(w io.Writer) {
				fmt.Fprintln(w, "ID\tSAGA\tACTION\tSTATE\tREQUESTED\tACTOR\tREASON")
				for _, o := range out.Operations {
					state := o.State
					if o.Error != "" {
						state += ": " + truncate(o.Error, 50)
					}
					fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", o.ID, o.SagaID, o.Action, state, fmtTime(o.RequestedAt), o.Actor, truncate(o.Reason, 40))
				}
			})
		},
	}
	list.Flags().BoolVar(&all, "all", false, "every request (applied, refused and withdrawn too), newest first")
	list.Flags().IntVar(&limit, "limit", 100, "most requests to list")

	var actor string
	cancel := &cobra.Command{
		Use:   "cancel REQUEST_ID",
		Short: "Withdraw a pending operator request: no orchestrator applies it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseInt(args[0], 10, 64)
			if err != nil || id < 1 {
				return withCode(ExitUsage, fmt.Errorf("%q is not a request id (a positive number; see `sagabox ops list`)", args[0]))
			}
			c, _, closeDB, err := a.client(cmd.Context())
			if err != nil {
				return err
			}
			defer closeDB()
			op, err := c.WithdrawRequest(cmd.Context(), id, actor)
			switch {
			case errors.Is(err, orchestrator.ErrNotFound):
				return withCode(ExitNotFound, fmt.Errorf("operator request %d does not exist in schema %s", id, a.schema))
			case errors.Is(err, orchestrator.ErrRequestNotPending):
				v := view.OperationOf(op)
				return withCode(ExitRefused, fmt.Errorf("operator request %d is %s, not pending: nothing to cancel", id, v.State))
			case err != nil:
				return err
			}
			v := view.OperationOf(op)
			return a.print(v, func(w io.Writer) {
				fmt.Fprintf(w, "operator request %d (%s of saga %s) withdrawn\n", op.ID, op.Action, op.SagaID)
			})
		},
	}
	cancel.Flags().StringVar(&actor, "actor", defaultActor(), "who withdraws it (recorded with the request)")
	cmd.AddCommand(withJSON(list), withJSON(cancel))
	return cmd
}
