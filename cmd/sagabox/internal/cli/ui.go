package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sagabox/sagabox/console"
	"github.com/sagabox/sagabox/store"
)

func (a *app) uiCommand() *cobra.Command {
	var addr, actor string
	var allow bool
	var more []string
	cmd := &cobra.Command{
		Use:   "ui",
		Short: "Serve the web console: sagas, timelines, outbox backlog, dead letters, pending requests",
		Long: "Serve the web console of --schema (an orchestrator's schema) on --addr until interrupted.\n\n" +
			"It is read-only unless --allow-actions is given; then it offers retry, cancel, terminate and restart of a saga\n" +
			"(applied by a running orchestrator of the schema) and replay of dead outbox rows, each with\n" +
			"a required reason, recorded with --actor. It has no authentication of its own: keep --addr\n" +
			"on localhost or put it behind a proxy that authenticates.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if strings.TrimSpace(actor) == "" {
				return withCode(ExitUsage, errors.New("--actor must not be empty"))
			}
			ctx := cmd.Context()
			st, pool, err := a.openStore(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			// Read-only, the console needs the read-only role's grants in
			// every schema it shows; with actions (which replay other
			// schemas' dead outbox rows too), the runtime role's.
			if err := st.CheckPrivileges(ctx, &store.PrivilegeOpts{ReadOnly: !allow}); err != nil {
				return err
			}
			for _, schema := range more {
				other, err := store.New(pool, schema)
				if err != nil {
					return withCode(ExitUsage, fmt.Errorf("--messaging-schema: %w", err))
				}
				if err := other.CheckPrivileges(ctx, &store.PrivilegeOpts{ReadOnly: !allow}); err != nil {
					return err
				}
			}
			if err := st.CheckSchema(ctx, store.LineMessaging, store.LineSaga); err != nil {
				return err
			}
			h, err := console.New(console.Config{
				Pool: pool, Schema: a.schema, MessagingSchemas: more, AllowActions: allow,
				Actor: func(*http.Request) string { return actor },
			})
			if err != nil {
				return withCode(ExitUsage, err)
			}
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return withCode(ExitUsage, fmt.Errorf("--addr %s: %w", addr, err))
			}
			mode := "read-only"
			if allow {
				mode = "actions allowed, as " + actor
			}
			fmt.Fprintf(a.stdout, "sagabox console of schema %s on http://%s/ (%s); Ctrl-C stops it\n", a.schema, ln.Addr(), mode)
			return serve(ctx, ln, h)
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:8080", "address to listen on")
	cmd.Flags().BoolVar(&allow, "allow-actions", false, "offer saga retry, cancel, terminate and restart, and the replay of dead outbox rows (each asks for a reason)")
	cmd.Flags().StringVar(&actor, "actor", defaultActor(), "who performs the actions (recorded with each)")
	cmd.Flags().StringSliceVar(&more, "messaging-schema", nil, "more service schemas whose outbox, dead letters and barrier marks to show (repeat or comma-separate)")
	return cmd
}

// serve serves h on ln until ctx is done, then shuts down within 5 s.
func serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("serve console: %w", err)
	case <-ctx.Done():
	}
	shutCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutCtx); err != nil {
		return fmt.Errorf("stop console: %w", err)
	}
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve console: %w", err)
	}
	return nil
}
