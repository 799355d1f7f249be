package cli

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/sagabox/sagabox/cmd/sagabox/internal/view"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
)

// bulkFirst is how many saga ids a bulk action prints.
const bulkFirst = 20

func (a *app) sagaBulkCommand() *cobra.Command {
	var opts orchestrator.ListOpts
	var statuses []string
	var keyPrefix, actor, reason string
	var limit int
	var yes bool
	var restart restartFlags
	cmd := &cobra.Command{
		Use:   "bulk {retry|cancel|terminate|restart} --reason TEXT [filters] [--yes]",
		Short: "Retry, cancel, terminate or restart every saga a filter selects (a dry run unless --yes)",
		Long: "Selects sagas by type, status, version, idleness and start-key prefix and records an\n" +
			"operator request for each one whose status the action applies to, as `saga retry`,\n" +
			"`saga cancel`, `saga terminate` and `saga restart` (with its --from, --to-version and\n" +
			"--data) do for one saga. Without --yes it only prints how many\n" +
			"sagas it would act on and the first ids. The requests are applied by a running\n" +
			"orchestrator; follow them with `sagabox ops list`, withdraw them with `sagabox ops cancel`.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			action := args[0]
			switch action {
			case "retry", "cancel", "terminate", "restart":
			default:
				return withCode(ExitUsage, fmt.Errorf("action %q: want retry, cancel, terminate or restart", action))
			}
			var restartOpts *orchestrator.RestartOpts
			if action == "restart" {
				var err error
				if restartOpts, err = restart.opts(); err != nil {
					return err
				}
			}
			if strings.TrimSpace(reason) == "" {
				return withCode(ExitUsage, errors.New("--reason is required: it is recorded in each saga's history"))
			}
			if strings.TrimSpace(actor) == "" {
				return withCode(ExitUsage, errors.New("--actor is required: it is recorded in each saga's history"))
			}
			if err := positive("limit", limit); err != nil {
				return err
			}
			if opts.OlderThan < 0 {
				return withCode(ExitUsage, fmt.Errorf("--older-than %s: want a positive duration", opts.OlderThan))
			}
			if opts.Version < 0 {
				return withCode(ExitUsage, fmt.Errorf("--version %d: want a positive version", opts.Version))
			}
			if opts.Type == "" && len(statuses) == 0 && keyPrefix == "" {
				return withCode(ExitUsage, errors.New("name at least one of --type, --status or --key-prefix: a bulk action on every saga is not what anyone means"))
			}
			for _, s := range statuses {
				st := saga.Status(s)
				if !st.Valid() {
					return withCode(ExitUsage, fmt.Errorf("--status %q: want queued, running, compensating, completed, compensated, failed or terminated", s))
				}
				opts.Statuses = append(opts.Statuses, st)
			}
			ctx := cmd.Context()
			c, _, closeDB, err := a.client(ctx)
			if err != nil {
				return err
			}
			defer closeDB()

			out := view.Bulk{Action: action, DryRun: !yes, First: []uuid.UUID{}, Requests: []view.Operation{}}
			var selected []*orchestrator.Saga
			opts.Limit = orchestrator.DefaultListLimit
			for len(selected) < limit {
				page, err := c.List(ctx, &opts)
				if err != nil {
					return err
				}
				for _, s := range page.Sagas {
					if !strings.HasPrefix(s.StartKey, keyPrefix) {
						continue
					}
					out.Matched++
					if applicable(action, s) == "" && len(selected) < limit {
						selected = append(selected, s)
					}
				}
				if page.Cursor == "" {
					break
				}
				opts.After = page.Cursor
			}
			out.Applicable = len(selected)
			for i, s := range selected {
				if i < bulkFirst {
					out.First = append(out.First, s.ID)
				}
			}
			if yes {
				for _, s := range selected {
					op, err := c.RequestAction(ctx, s.ID, action, actor, reason, restartOpts)
					if err != nil {
						return fmt.Errorf("%s of saga %s (after %d requests): %w", action, s.ID, len(out.Requests), err)
					}
					out.Requests = append(out.Requests, view.OperationOf(op))
				}
			}
			return a.print(out, func(w io.Writer) {
				verb := "would request"
				if yes {
					verb = "requested"
				}
				fmt.Fprintf(w, "%d sagas matched; %s %s of %d (the others' status rules it out)\n", out.Matched, verb, action, out.Applicable)
				for _, id := range out.First {
					fmt.Fprintln(w, id)
				}
				if len(selected) > len(out.First) {
					fmt.Fprintf(w, "… and %d more\n", len(selected)-len(out.First))
				}
				if !yes && out.Applicable > 0 {
					fmt.Fprintln(w, "dry run: nothing was requested; run again with --yes")
				}
				if yes && out.Applicable > 0 {
					fmt.Fprintln(w, "follow them with `sagabox ops list`; `sagabox ops cancel ID` withdraws one")
				}
			})
		},
	}
	cmd.Flags().StringVar(&opts.Type, "type", "", "only sagas of this definition name")
	cmd.Flags().IntVar(&opts.Version, "version", 0, "only sagas of this definition version")
	cmd.Flags().StringSliceVar(&statuses, "status", nil, "only sagas in these statuses (comma-separated)")
	cmd.Flags().DurationVar(&opts.OlderThan, "older-than", 0, "only sagas not updated for this long (e.g. 1h)")
	cmd.Flags().StringVar(&keyPrefix, "key-prefix", "", "only sagas whose start key begins with this")
	cmd.Flags().IntVar(&limit, "limit", 1000, "act on at most this many sagas")
	cmd.Flags().StringVar(&reason, "reason", "", "why (recorded in each saga's history; required)")
	cmd.Flags().StringVar(&actor, "actor", defaultActor(), "who (recorded in each saga's history)")
	cmd.Flags().BoolVar(&yes, "yes", false, "record the requests (without it: a dry run)")
	restart.register(cmd)
	return withJSON(cmd)
}
