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

	"github.com/sagabox/sagabox/internal/driver"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store"
)

// ExitPending means an operator request was recorded but no orchestrator
// applied it in time.
const ExitPending = 5

func (a *app) sagaCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "saga", Short: "List, show, retry, cancel and terminate sagas"}
	cmd.AddCommand(a.sagaListCommand(), a.sagaShowCommand(), a.sagaActionCommand("retry"), a.sagaActionCommand("cancel"),
		a.sagaActionCommand("terminate"))
	return cmd
}

// client returns an orchestrator client without a broker: it reads sagas
// and records operator requests.
func (a *app) client(ctx context.Context) (*orchestrator.Client, *store.Store, func(), error) {
	st, pool, err := a.openStore(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	c, err := orchestrator.NewClient(orchestrator.Config{Pool: pool, Schema: a.schema, Service: "sagabox-cli"})
	if err != nil {
		pool.Close()
		return nil, nil, nil, err
	}
	if err := st.CheckSchema(ctx, store.LineMessaging, store.LineSaga); err != nil {
		pool.Close()
		return nil, nil, nil, err
	}
	return c, st, pool.Close, nil
}

// sagaRow is the JSON and table shape of a saga in a listing.
type sagaRow struct {
	ID          uuid.UUID   `json:"id"`
	Type        string      `json:"type"`
	Version     int         `json:"version"`
	Status      saga.Status `json:"status"`
	CurrentStep string      `json:"current_step,omitempty"`
	LastError   string      `json:"last_error,omitempty"`
	StartKey    string      `json:"start_key,omitempty"`
	CreatedAt   time.Time   `json:"created_at"`
	UpdatedAt   time.Time   `json:"updated_at"`
}

func rowOf(s *orchestrator.Saga) sagaRow {
	r := sagaRow{ID: s.ID, Type: s.Type, Version: s.Version, Status: s.Status, LastError: s.LastError,
		StartKey: s.StartKey, CreatedAt: s.CreatedAt, UpdatedAt: s.UpdatedAt}
	if s.CurrentStep >= 0 && s.CurrentStep < len(s.Steps) {
		r.CurrentStep = s.Steps[s.CurrentStep].Name
	}
	return r
}

func (a *app) sagaListCommand() *cobra.Command {
	var opts orchestrator.ListOpts
	var statuses []string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List sagas, oldest (first started) first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, s := range statuses {
				st := saga.Status(s)
				if !st.Valid() {
					return withCode(ExitUsage, fmt.Errorf("--status %q: want running, compensating, completed, compensated, failed or terminated", s))
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
				return err
			}
			rows := make([]sagaRow, len(res.Sagas))
			for i, s := range res.Sagas {
				rows[i] = rowOf(s)
			}
			out := struct {
				Sagas  []sagaRow `json:"sagas"`
				Cursor string    `json:"next_cursor,omitempty"`
			}{rows, res.Cursor}
			return a.print(out, func(w io.Writer) {
				fmt.Fprintln(w, "ID\tTYPE\tSTATUS\tSTEP\tSTART KEY\tIDLE\tLAST ERROR")
				for _, r := range rows {
					fmt.Fprintf(w, "%s\t%s v%d\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.Type, r.Version, r.Status, dash(r.CurrentStep),
						dash(truncate(r.StartKey, 40)), fmtDuration(time.Since(r.UpdatedAt)), dash(truncate(r.LastError, 60)))
				}
				if res.Cursor != "" {
					fmt.Fprintf(w, "(more: --after %s)\n", res.Cursor)
				}
			})
		},
	}
	cmd.Flags().StringVar(&opts.Type, "type", "", "only sagas of this definition name")
	cmd.Flags().StringSliceVar(&statuses, "status", nil, "only sagas in these statuses (comma-separated)")
	cmd.Flags().StringVar(&opts.StartKey, "key", "", "only sagas started with this start key")
	cmd.Flags().DurationVar(&opts.OlderThan, "older-than", 0, "only sagas not updated for this long (e.g. 10m)")
	cmd.Flags().IntVar(&opts.Limit, "limit", 50, "page size")
	cmd.Flags().StringVar(&opts.After, "after", "", "continue after this cursor (printed at the end of a page)")
	return cmd
}

func (a *app) sagaShowCommand() *cobra.Command {
	var key, sagaType string
	cmd := &cobra.Command{
		Use:   "show SAGA_ID | show --key START_KEY [--type NAME]",
		Short: "Show one saga: data, step states and its full timeline",
		Args: func(cmd *cobra.Command, args []string) error {
			if key != "" {
				return cobra.NoArgs(cmd, args)
			}
			return cobra.ExactArgs(1)(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			var id uuid.UUID
			if key == "" {
				var err error
				if id, err = parseID(args[0]); err != nil {
					return err
				}
			}
			c, _, closeDB, err := a.client(cmd.Context())
			if err != nil {
				return err
			}
			defer closeDB()
			var s *orchestrator.Saga
			if key != "" {
				s, err = sagaByKey(cmd.Context(), c, sagaType, key)
				if err != nil {
					return err
				}
				id = s.ID
			} else {
				s, err = c.Get(cmd.Context(), id)
			}
			if errors.Is(err, orchestrator.ErrNotFound) {
				return withCode(ExitNotFound, fmt.Errorf("saga %s does not exist in schema %s", id, a.schema))
			}
			if err != nil {
				return err
			}
			hist, err := c.History(cmd.Context(), id)
			if err != nil {
				return err
			}
			out := struct {
				*orchestrator.Saga
				History []saga.HistoryEntry `json:"history"`
			}{s, hist}
			return a.print(out, func(w io.Writer) {
				fmt.Fprintf(w, "saga\t%s\n", s.ID)
				fmt.Fprintf(w, "type\t%s v%d\n", s.Type, s.Version)
				fmt.Fprintf(w, "status\t%s (%s phase)\n", s.Status, s.Phase)
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
				fmt.Fprintln(w, "\nSTEP\tSTATUS\tATTEMPT\tLAST ERROR")
				for i, st := range s.Steps {
					marker := " "
					if i == s.CurrentStep {
						marker = "*"
					}
					fmt.Fprintf(w, "%s %s\t%s\t%d\t%s\n", marker, st.Name, st.Status, st.Attempt, dash(st.LastError))
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
	cmd.Flags().StringVar(&key, "key", "", "show the saga started with this start key instead of naming its id")
	cmd.Flags().StringVar(&sagaType, "type", "", "with --key: the saga's definition name (needed when sagas of several types use the key)")
	return cmd
}

// sagaByKey finds the saga started with key: of sagaType, or of any type
// if only one type uses the key.
func sagaByKey(ctx context.Context, c *orchestrator.Client, sagaType, key string) (*orchestrator.Saga, error) {
	if sagaType != "" {
		s, err := c.GetByKey(ctx, sagaType, key)
		if errors.Is(err, orchestrator.ErrNotFound) {
			return nil, withCode(ExitNotFound, fmt.Errorf("no %s saga has start key %q", sagaType, key))
		}
		return s, err
	}
	res, err := c.List(ctx, &orchestrator.ListOpts{StartKey: key})
	if err != nil {
		return nil, err
	}
	types := map[string]bool{}
	for _, s := range res.Sagas {
		types[s.Type] = true
	}
	switch {
	case len(res.Sagas) == 0:
		return nil, withCode(ExitNotFound, fmt.Errorf("no saga has start key %q", key))
	case len(types) > 1:
		return nil, withCode(ExitUsage, fmt.Errorf("sagas of %d types have start key %q: name one with --type", len(types), key))
	}
	// The one the key names now (the newest, if it was reused).
	return c.GetByKey(ctx, res.Sagas[0].Type, key)
}

func (a *app) sagaActionCommand(action string) *cobra.Command {
	var actor, reason string
	var wait time.Duration
	short := map[string]string{
		"retry":     "Re-send what a saga has in flight (a failed saga's compensation, a stuck step's command)",
		"cancel":    "Cancel a running saga: compensate its current step and the completed ones (ends compensated)",
		"terminate": "Stop a running, compensating or failed saga at once, compensating nothing (ends terminated)",
	}[action]
	var aliases []string
	if action == "cancel" {
		aliases = []string{"abort"} // its former name
	}
	cmd := &cobra.Command{
		Use:     action + " SAGA_ID --reason TEXT",
		Aliases: aliases,
		Short:   short,
		Long: short + ".\n\nThe request is recorded in the database and applied by a running orchestrator of the\n" +
			"schema (it has the saga definitions); the command waits for the outcome.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			if strings.TrimSpace(reason) == "" {
				return withCode(ExitUsage, errors.New("--reason is required: it is recorded in the saga's history"))
			}
			ctx := cmd.Context()
			c, st, closeDB, err := a.client(ctx)
			if err != nil {
				return err
			}
			defer closeDB()
			if _, err := c.Get(ctx, id); errors.Is(err, orchestrator.ErrNotFound) {
				return withCode(ExitNotFound, fmt.Errorf("saga %s does not exist in schema %s", id, a.schema))
			} else if err != nil {
				return err
			}
			op, err := st.Executor().RequestOperation(ctx, id, action, actor, reason)
			if err != nil {
				return err
			}
			op, err = waitApplied(ctx, st, op.ID, wait)
			if err != nil {
				return err
			}
			if op.AppliedAt.IsZero() {
				return withCode(ExitPending, fmt.Errorf("%s of saga %s requested (request %d), but no orchestrator applied it within %s; is an orchestrator running for schema %s? It will be applied when one runs",
					action, id, op.ID, wait, a.schema))
			}
			if op.Error != "" {
				return withCode(ExitRefused, fmt.Errorf("%s of saga %s refused: %s", action, id, op.Error))
			}
			s, err := c.Get(ctx, id)
			if err != nil {
				return err
			}
			return a.print(rowOf(s), func(w io.Writer) {
				fmt.Fprintf(w, "%s of saga %s applied; status is now %s\n", action, id, s.Status)
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why (recorded in the saga's history; required)")
	cmd.Flags().StringVar(&actor, "actor", defaultActor(), "who (recorded in the saga's history)")
	cmd.Flags().DurationVar(&wait, "wait", 15*time.Second, "how long to wait for an orchestrator to apply the request")
	return cmd
}

func waitApplied(ctx context.Context, st *store.Store, id int64, wait time.Duration) (driver.Operation, error) {
	deadline := time.Now().Add(wait)
	for {
		op, err := st.Executor().Operation(ctx, id)
		if err != nil || !op.AppliedAt.IsZero() || time.Now().After(deadline) {
			return op, err
		}
		select {
		case <-ctx.Done():
			return op, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
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
