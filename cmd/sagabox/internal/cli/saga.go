package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/sagabox/sagabox/cmd/sagabox/internal/view"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store"
)

// ExitPending means an operator request was recorded but no orchestrator
// applied it in time (it was withdrawn unless --keep was given).
const ExitPending = 5

func (a *app) sagaCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "saga", Short: "List, show, draw, retry, cancel, terminate and restart sagas"}
	cmd.AddCommand(a.sagaListCommand(), a.sagaShowCommand(), a.sagaActionCommand("retry"), a.sagaActionCommand("cancel"),
		a.sagaActionCommand("terminate"), a.sagaActionCommand("restart"), a.sagaBulkCommand(),
		a.sagaDefinitionsCommand(), a.sagaGraphCommand(), a.sagaTimelineCommand())
	return cmd
}

// client returns an orchestrator client without a broker: it reads sagas
// and records operator requests.
func (a *app) client(ctx context.Context) (*orchestrator.Client, *store.Store, func(), error) {
	st, pool, err := a.openStore(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := a.checkSchema(ctx, st, pool, store.LineMessaging, store.LineSaga); err != nil {
		pool.Close()
		return nil, nil, nil, err
	}
	c, err := orchestrator.NewClient(orchestrator.Config{Pool: pool, Schema: a.schema, Service: "sagabox-cli"})
	if err != nil {
		pool.Close()
		return nil, nil, nil, err
	}
	return c, st, pool.Close, nil
}

func (a *app) sagaListCommand() *cobra.Command {
	var opts orchestrator.ListOpts
	var statuses []string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List sagas, oldest (first started) first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := positive("limit", opts.Limit); err != nil {
				return err
			}
			if opts.OlderThan < 0 {
				return withCode(ExitUsage, fmt.Errorf("--older-than %s: want a positive duration", opts.OlderThan))
			}
			for _, s := range statuses {
				st := saga.Status(s)
				if !st.Valid() {
					return withCode(ExitUsage, fmt.Errorf("--status %q: want queued, running, compensating, completed, compensated, failed or terminated", s))
				}
				opts.Statuses = append(opts.Statuses, st)
			}
			c, _, closeDB, err := a.client(cmd.Context())
			if err != nil {
				return err
			}
			defer closeDB()
			res, err := c.List(cmd.Context(), &opts)
			if err != nil {
				if strings.Contains(err.Error(), "ListOpts.After") {
					return withCode(ExitUsage, fmt.Errorf("--after %q is not a cursor this command printed", opts.After))
				}
				return err
			}
			out := view.SagaList{Sagas: make([]view.Saga, len(res.Sagas)), NextCursor: res.Cursor}
			for i, s := range res.Sagas {
				out.Sagas[i] = view.SagaOf(s)
			}
			return a.print(out, func(w io.Writer) {
				fmt.Fprintln(w, "ID\tTYPE\tSTATUS\tSTEP\tSTART KEY\tIDLE\tLAST ERROR")
				for _, r := range out.Sagas {
					fmt.Fprintf(w, "%s\t%s v%d\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.Type, r.Version, r.Status, dash(r.CurrentStep),
						dash(truncate(r.StartKey, 30)), fmtDuration(time.Since(r.UpdatedAt)), dash(truncate(r.LastError, 60)))
				}
				if res.Cursor != "" {
					fmt.Fprintf(w, "(more: --after %s)\n", res.Cursor)
				}
			})
		},
	}
	cmd.Flags().StringVar(&opts.Type, "type", "", "only sagas of this definition name")
	cmd.Flags().StringSliceVar(&statuses, "status", nil, "only sagas in these statuses (comma-separated)")
	cmd.Flags().StringVar(&opts.StartKey, "key", "", "only sagas started with this start key (StartOpts.StartKey)")
	cmd.Flags().DurationVar(&opts.OlderThan, "older-than", 0, "only sagas not updated for this long (e.g. 10m)")
	cmd.Flags().IntVar(&opts.Limit, "limit", 50, "page size")
	cmd.Flags().StringVar(&opts.After, "after", "", "continue after this cursor (printed at the end of a page)")
	return withJSON(cmd)
}

// resolveSaga returns the saga named by an id argument or by --key (and
// --type): exactly one of them must be given.
func (a *app) resolveSaga(ctx context.Context, c *orchestrator.Client, args []string, key, sagaType string) (*orchestrator.Saga, error) {
	if key == "" {
		id, err := parseID(args[0])
		if err != nil {
			return nil, err
		}
		s, err := c.Get(ctx, id)
		if errors.Is(err, orchestrator.ErrNotFound) {
			return nil, withCode(ExitNotFound, fmt.Errorf("saga %s does not exist in schema %s", id, a.schema))
		}
		return s, err
	}
	res, err := c.List(ctx, &orchestrator.ListOpts{Type: sagaType, StartKey: key, Limit: 2})
	if err != nil {
		return nil, err
	}
	switch len(res.Sagas) {
	case 0:
		return nil, withCode(ExitNotFound, fmt.Errorf("no saga with start key %q in schema %s", key, a.schema))
	case 1:
		return res.Sagas[0], nil
	}
	return nil, withCode(ExitUsage, fmt.Errorf("sagas of several types have start key %q: name one with --type", key))
}

// sagaArgs accepts SAGA_ID, or no argument with --key.
func sagaArgs(key *string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		switch {
		case *key == "" && len(args) != 1:
			return withCode(ExitUsage, errors.New("name the saga: SAGA_ID or --key START_KEY"))
		case *key != "" && len(args) != 0:
			return withCode(ExitUsage, errors.New("name the saga by SAGA_ID or by --key, not both"))
		case *key == "":
			_, err := parseID(args[0])
			return err
		}
		return nil
	}
}

func (a *app) sagaShowCommand() *cobra.Command {
	var key, sagaType string
	cmd := &cobra.Command{
		Use:   "show {SAGA_ID | --key START_KEY [--type TYPE]}",
		Short: "Show one saga: data, step states and its full timeline",
		Args:  sagaArgs(&key),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, closeDB, err := a.client(cmd.Context())
			if err != nil {
				return err
			}
			defer closeDB()
			s, err := a.resolveSaga(cmd.Context(), c, args, key, sagaType)
			if err != nil {
				return err
			}
			hist, err := c.History(cmd.Context(), s.ID)
			if err != nil {
				return err
			}
			out := view.SagaDetailOf(s, hist)
			return a.print(out, func(w io.Writer) {
				fmt.Fprintf(w, "saga\t%s\n", s.ID)
				fmt.Fprintf(w, "type\t%s v%d\n", s.Type, s.Version)
				fmt.Fprintf(w, "status\t%s (%s phase)\n", s.Status, s.Phase)
				if s.Run > 0 {
					fmt.Fprintf(w, "run\t%d (restarted %d time(s))\n", s.Run, s.Run)
				}
				if s.StartKey != "" {
					fmt.Fprintf(w, "start key\t%s\n", s.StartKey)
				}
				fmt.Fprintf(w, "created\t%s\n", s.CreatedAt.UTC().Format(time.RFC3339Nano))
				fmt.Fprintf(w, "updated\t%s\n", s.UpdatedAt.UTC().Format(time.RFC3339Nano))
				if !s.Deadline.IsZero() {
					fmt.Fprintf(w, "next deadline\t%s\n", s.Deadline.UTC().Format(time.RFC3339Nano))
				}
				if s.LastError != "" {
					fmt.Fprintf(w, "last error\t%s\n", s.LastError)
				}
				data, _ := json.MarshalIndent(json.RawMessage(s.Data), "", "  ")
				fmt.Fprintf(w, "\ndata:\n%s\n", data)
				fmt.Fprintln(w, "\nSTEP\tGROUP\tSTATUS\tATTEMPT\tLAST ERROR")
				current := ""
				if s.CurrentStep >= 0 && s.CurrentStep < len(s.Steps) {
					current = s.Steps[s.CurrentStep].Group
				}
				for i, st := range s.Steps {
					marker := " "
					if i == s.CurrentStep || (current != "" && st.Group == current) {
						marker = "*" // the step in flight, or every branch of the group in flight
					}
					fmt.Fprintf(w, "%s %s\t%s\t%s\t%d\t%s\n", marker, st.Name, dash(st.Group), st.Status, st.Attempt, dash(st.LastError))
				}
				fmt.Fprintln(w, "\nTIME\tSTEP\tEVENT\tATTEMPT\tDETAIL")
				for _, h := range hist {
					detail := h.Detail
					if h.Actor != "" {
						detail = strings.TrimSpace(detail + " (by " + h.Actor + ")")
					}
					fmt.Fprintf(w, "+%s\t%s\t%s\t%d\t%s\n", h.At.Sub(s.CreatedAt).Round(100*time.Microsecond), dash(h.Step), h.Event, h.Attempt, dash(detail))
				}
			})
		},
	}
	cmd.Flags().StringVar(&key, "key", "", "the saga's start key instead of its id")
	cmd.Flags().StringVar(&sagaType, "type", "", "with --key: the saga's type, when sagas of several types share the key")
	return withJSON(cmd)
}

// applicable returns why action cannot apply to s in its status, or "".
// It is the saga core's rule (saga.Runner.Apply), checked before a request
// is recorded so that a request that cannot apply is refused at once.
func applicable(action string, s *orchestrator.Saga) string {
	switch action {
	case "cancel", "abort":
		if s.Status != saga.StatusRunning && s.Status != saga.StatusQueued {
			return fmt.Sprintf("only a running or queued saga can be cancelled, this one is %s", s.Status)
		}
	case "terminate":
		switch s.Status {
		case saga.StatusQueued, saga.StatusRunning, saga.StatusCompensating, saga.StatusFailed:
		default:
			return fmt.Sprintf("a %s saga has ended; there is nothing to terminate", s.Status)
		}
	case "retry":
		switch s.Status {
		case saga.StatusRunning, saga.StatusCompensating, saga.StatusFailed:
		default:
			return fmt.Sprintf("a %s saga has nothing to retry", s.Status)
		}
	case "restart":
		if s.Status != saga.StatusFailed && s.Status != saga.StatusCompensated {
			return fmt.Sprintf("only a failed or compensated saga can be restarted, this one is %s", s.Status)
		}
	}
	return ""
}

// restartFlags are the flags of a restart, single or bulk.
type restartFlags struct {
	from, data string
	version    int
}

func (f *restartFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.from, "from", "", "the step (or parallel group) to run the saga again from (required)")
	cmd.Flags().IntVar(&f.version, "to-version", 0, "run the saga on this newer version of its definition (default: its own)")
	cmd.Flags().StringVar(&f.data, "data", "", "replace the saga's data with this JSON, or @FILE to read it from a file (default: the data as stored)")
}

// opts returns the options of a restart request, checked as far as the CLI
// can (the orchestrator checks the step and the data's type).
func (f *restartFlags) opts() (*orchestrator.RestartOpts, error) {
	if strings.TrimSpace(f.from) == "" {
		return nil, withCode(ExitUsage, errors.New("--from is required: the step to run the saga again from"))
	}
	if f.version < 0 {
		return nil, withCode(ExitUsage, fmt.Errorf("--to-version %d: want a positive version", f.version))
	}
	opts := orchestrator.RestartOpts{From: f.from, Version: f.version}
	if f.data != "" {
		data := []byte(f.data)
		if name, ok := strings.CutPrefix(f.data, "@"); ok {
			b, err := os.ReadFile(name)
			if err != nil {
				return nil, withCode(ExitUsage, fmt.Errorf("--data: %w", err))
			}
			data = b
		}
		if !json.Valid(data) {
			return nil, withCode(ExitUsage, errors.New("--data is not valid JSON"))
		}
		opts.Data = data
	}
	return &opts, nil
}

func (a *app) sagaActionCommand(action string) *cobra.Command {
	var actor, reason, key, sagaType string
	var wait time.Duration
	var keep bool
	short := map[string]string{
		"retry":     "Re-send what a saga has in flight (a failed saga's compensation, a stuck step's command)",
		"cancel":    "Cancel a running saga: compensate its current step and the completed ones (ends compensated); a queued saga ends compensated at once",
		"terminate": "Stop a queued, running, compensating or failed saga at once, compensating nothing (ends terminated)",
		"restart":   "Run a failed or compensated saga again from a step (--from), optionally on a newer version or with new data",
	}[action]
	var restart restartFlags
	use := action + " {SAGA_ID | --key START_KEY} --reason TEXT"
	if action == "restart" {
		use += " --from STEP"
	}
	var aliases []string
	if action == "cancel" {
		aliases = []string{"abort"} // its former name
	}
	cmd := &cobra.Command{
		Use:     use,
		Aliases: aliases,
		Short:   short,
		Long: short + ".\n\nThe request is recorded in the database and applied by a running orchestrator of the\n" +
			"schema (it has the saga definitions); the command waits for the outcome. A request the\n" +
			"saga's status rules out is refused at once (exit 4). When --wait expires, or on Ctrl-C,\n" +
			"the request is withdrawn so that it never fires later (exit 5), unless --keep is given:\n" +
			"then it stays queued for the next orchestrator (`sagabox ops list`, `sagabox ops cancel`).",
		Args: sagaArgs(&key),
		RunE: func(cmd *cobra.Command, args []string) error {
			if strings.TrimSpace(reason) == "" {
				return withCode(ExitUsage, errors.New("--reason is required: it is recorded in the saga's history"))
			}
			if strings.TrimSpace(actor) == "" {
				return withCode(ExitUsage, errors.New("--actor is required: it is recorded in the saga's history"))
			}
			if wait < 0 {
				return withCode(ExitUsage, fmt.Errorf("--wait %s: want 0 or more", wait))
			}
			var restartOpts *orchestrator.RestartOpts
			if action == "restart" {
				var err error
				if restartOpts, err = restart.opts(); err != nil {
					return err
				}
			}
			ctx := cmd.Context()
			c, _, closeDB, err := a.client(ctx)
			if err != nil {
				return err
			}
			defer closeDB()
			s, err := a.resolveSaga(ctx, c, args, key, sagaType)
			if err != nil {
				return err
			}
			if why := applicable(action, s); why != "" {
				return withCode(ExitRefused, fmt.Errorf("%s of saga %s refused: %s", action, s.ID, why))
			}
			op, err := c.RequestAction(ctx, s.ID, action, actor, reason, restartOpts)
			if err != nil {
				return err
			}
			if read, err := c.WaitRequest(ctx, op.ID, wait); err != nil && ctx.Err() == nil {
				return err
			} else if read != nil {
				op = read
			}
			if op.Pending() && (!keep || ctx.Err() != nil) {
				// Expired or interrupted: withdraw, unless an orchestrator
				// applied it meanwhile (then report that outcome).
				wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
				defer cancel()
				withdrawn, err := c.WithdrawRequest(wctx, op.ID, actor)
				if err != nil && !errors.Is(err, orchestrator.ErrRequestNotPending) {
					return fmt.Errorf("%s of saga %s: request %d was not applied and could not be withdrawn (withdraw it with `sagabox ops cancel %d`): %w", action, s.ID, op.ID, op.ID, err)
				}
				op = withdrawn
				if op.Pending() || !op.WithdrawnAt.IsZero() {
					why := fmt.Sprintf("no orchestrator applied it within %s (is an orchestrator running for schema %s?)", wait, a.schema)
					if ctx.Err() != nil {
						why = "interrupted"
					}
					return a.pending(op, withCode(ExitPending, fmt.Errorf("%s of saga %s not applied: %s. Request %d withdrawn: it will not be applied (--keep leaves it queued)",
						action, s.ID, why, op.ID)))
				}
			}
			if op.Pending() {
				return a.pending(op, withCode(ExitPending, fmt.Errorf("%s of saga %s requested (request %d), but no orchestrator applied it within %s; is an orchestrator running for schema %s? It stays queued (--keep) and is applied when one runs; `sagabox ops cancel %d` withdraws it",
					action, s.ID, op.ID, wait, a.schema, op.ID)))
			}
			if op.Error != "" {
				return a.pending(op, withCode(ExitRefused, fmt.Errorf("%s of saga %s refused: %s", action, s.ID, op.Error)))
			}
			s, err = c.Get(context.WithoutCancel(ctx), s.ID)
			if err != nil {
				return err
			}
			sv := view.SagaOf(s)
			return a.print(view.OperationResult{Operation: view.OperationOf(op), Saga: &sv}, func(w io.Writer) {
				fmt.Fprintf(w, "%s of saga %s applied; status is now %s\n", action, s.ID, s.Status)
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why (recorded in the saga's history; required)")
	cmd.Flags().StringVar(&actor, "actor", defaultActor(), "who (recorded in the saga's history)")
	cmd.Flags().DurationVar(&wait, "wait", 15*time.Second, "how long to wait for an orchestrator to apply the request")
	cmd.Flags().BoolVar(&keep, "keep", false, "leave the request queued when --wait expires (it is applied when an orchestrator runs)")
	cmd.Flags().StringVar(&key, "key", "", "the saga's start key instead of its id")
	cmd.Flags().StringVar(&sagaType, "type", "", "with --key: the saga's type, when sagas of several types share the key")
	if action == "restart" {
		restart.register(cmd)
	}
	return withJSON(cmd)
}

// pending prints op with --json (a script learns the request's id and
// state) and returns err, which carries the exit code.
func (a *app) pending(op *orchestrator.Request, err error) error {
	if a.json {
		if perr := a.print(view.OperationResult{Operation: view.OperationOf(op)}, nil); perr != nil {
			return perr
		}
	}
	return err
}

func defaultActor() string {
	name := "unknown"
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	if host, err := os.Hostname(); err == nil {
		name += "@" + host
	}
	return name
}

func parseID(s string) (uuid.UUID, error) {
	id, err := uuid.Parse(s)
	if err != nil {
		return uuid.Nil, withCode(ExitUsage, fmt.Errorf("%q is not a saga id (a UUID)", s))
	}
	return id, nil
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func truncate(s string, n int) string {
	if len([]rune(s)) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}
