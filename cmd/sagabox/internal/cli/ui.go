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

// uiAuth is the authentication flags of `sagabox ui`.
type uiAuth struct {
	header, groupsHeader, proxyRole, htpasswd string
	groupRoles, trustedProxies                []string
}

// config returns the console's AuthConfig of the flags, and a line that
// says who may sign in; every error names the flag at fault.
func (f uiAuth) config() (console.AuthConfig, string, error) {
	var cfg console.AuthConfig
	for _, p := range f.trustedProxies {
		if _, err := console.ParseTrustedProxy(p); err != nil {
			return cfg, "", fmt.Errorf("--trusted-proxy: %w", err)
		}
	}
	switch {
	case f.header != "" && len(f.trustedProxies) == 0:
		return cfg, "", fmt.Errorf("--auth-header %s needs --trusted-proxy: the addresses of the proxies it is believed from (from anywhere else it is refused)", f.header)
	case f.groupsHeader != "" && f.header == "":
		return cfg, "", errors.New("--groups-header needs --auth-header")
	case len(f.groupRoles) > 0 && f.groupsHeader == "":
		return cfg, "", errors.New("--group-role needs --groups-header: the header the proxy lists the user's groups in")
	}
	proxyRole := console.RoleNone
	if !strings.EqualFold(strings.TrimSpace(f.proxyRole), string(console.RoleNone)) {
		r, err := console.ParseRole(f.proxyRole)
		if err != nil {
			return cfg, "", fmt.Errorf("--proxy-role: %w (or none)", err)
		}
		proxyRole = r
	}
	roles := map[string]console.Role{}
	for _, gr := range f.groupRoles {
		group, role, ok := strings.Cut(gr, "=")
		group = strings.TrimSpace(group)
		if !ok || group == "" {
			return cfg, "", fmt.Errorf("--group-role %q: want GROUP=ROLE (e.g. sre=operator)", gr)
		}
		r, err := console.ParseRole(role)
		if err != nil {
			return cfg, "", fmt.Errorf("--group-role %q: %w", gr, err)
		}
		roles[group] = r
	}
	cfg = console.AuthConfig{ProxyHeader: f.header, ProxyGroupsHeader: f.groupsHeader, ProxyRole: proxyRole,
		TrustedProxies: f.trustedProxies, HtpasswdFile: f.htpasswd}
	if len(roles) > 0 {
		cfg.GroupRoles = roles
	}
	var who []string
	if f.htpasswd != "" {
		users, err := console.ReadHtpasswdFile(f.htpasswd)
		if err != nil {
			return cfg, "", fmt.Errorf("--htpasswd: %w", err)
		}
		operators := 0
		for _, r := range users {
			if r == console.RoleOperator {
				operators++
			}
		}
		who = append(who, fmt.Sprintf("basic auth against %s (%s, %s)", f.htpasswd, count(len(users), "user"), count(operators, "operator")))
	}
	if f.header != "" {
		who = append(who, fmt.Sprintf("the user in %s from %s", f.header, strings.Join(f.trustedProxies, ", ")))
	}
	return cfg, strings.Join(who, "; "), nil
}

// count is "1 thing" or "n things".
func count(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}

func (a *app) uiCommand() *cobra.Command {
	var addr, actor string
	var allow bool
	var more []string
	var auth uiAuth
	cmd := &cobra.Command{
		Use:   "ui",
		Short: "Serve the web console: sagas, timelines, outbox backlog, dead letters, pending requests",
		Long: "Serve the web console of --schema (an orchestrator's schema) on --addr until interrupted.\n\n" +
			"It is read-only unless --allow-actions is given; then it offers retry, cancel, terminate and restart of a saga\n" +
			"(applied by a running orchestrator of the schema) and replay of dead outbox rows, each with\n" +
			"a required reason.\n\n" +
			"Who is acting: with --htpasswd (basic auth against a file of bcrypt hashes, lines\n" +
			"user:hash:role) and/or --auth-header (the user named by an authenticating proxy such as\n" +
			"oauth2-proxy, believed only from --trusted-proxy addresses), every request must sign in,\n" +
			"viewers read, operators act, and each action is recorded under the signed-in user.\n" +
			"Without them the console authenticates nobody and records --actor: keep --addr on\n" +
			"localhost.",
		Example: "  sagabox ui --schema orders --allow-actions --htpasswd /etc/sagabox/console.htpasswd\n" +
			"  sagabox ui --schema orders --allow-actions --addr 10.0.0.5:8080 --auth-header X-Forwarded-Email \\\n" +
			"      --trusted-proxy 10.0.0.4 --groups-header X-Forwarded-Groups --group-role sre=operator",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			authCfg, signIn, err := auth.config()
			if err != nil {
				return withCode(ExitUsage, err)
			}
			authOn := auth.header != "" || auth.htpasswd != ""
			if authOn && cmd.Flags().Changed("actor") {
				return withCode(ExitUsage, errors.New("--actor cannot be used with --htpasswd or --auth-header: each action is recorded under the signed-in user"))
			}
			if !authOn && strings.TrimSpace(actor) == "" {
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
			cfg := console.Config{Pool: pool, Schema: a.schema, MessagingSchemas: more, AllowActions: allow, Auth: authCfg}
			if !authOn {
				cfg.Actor = func(*http.Request) string { return actor }
			}
			h, err := console.New(cfg)
			if err != nil {
				return withCode(ExitUsage, err)
			}
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return withCode(ExitUsage, fmt.Errorf("--addr %s: %w", addr, err))
			}
			var mode string
			switch {
			case authOn && allow:
				mode = "operators may act; sign-in: " + signIn
			case authOn:
				mode = "read-only; sign-in: " + signIn
			case allow:
				mode = "actions allowed, as " + actor + ", no authentication"
			default:
				mode = "read-only, no authentication"
			}
			fmt.Fprintf(a.stdout, "sagabox console of schema %s on http://%s/ (%s); Ctrl-C stops it\n", a.schema, ln.Addr(), mode)
			if tcp, ok := ln.Addr().(*net.TCPAddr); ok && !authOn && !tcp.IP.IsLoopback() {
				may := "read it"
				if allow {
					may = "read it and act"
				}
				fmt.Fprintf(a.stderr, "sagabox: warning: the console authenticates nobody and listens on %s, not on localhost: whoever reaches it may %s; use --htpasswd or --auth-header\n", ln.Addr(), may)
			}
			return serve(ctx, ln, h)
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:8080", "address to listen on")
	cmd.Flags().BoolVar(&allow, "allow-actions", false, "offer saga retry, cancel, terminate and restart, and the replay of dead outbox rows (each asks for a reason)")
	cmd.Flags().StringVar(&actor, "actor", defaultActor(), "who performs the actions (recorded with each), without --htpasswd or --auth-header")
	cmd.Flags().StringSliceVar(&more, "messaging-schema", nil, "more service schemas whose outbox, dead letters and barrier marks to show (repeat or comma-separate)")
	cmd.Flags().StringVar(&auth.htpasswd, "htpasswd", "", "sign in with basic auth against this file of users: lines user:bcrypt-hash:role (role viewer or operator; htpasswd -nB user prints user:hash)")
	cmd.Flags().StringVar(&auth.header, "auth-header", "", "the header in which an authenticating proxy names the user (e.g. X-Forwarded-Email); needs --trusted-proxy")
	cmd.Flags().StringSliceVar(&auth.trustedProxies, "trusted-proxy", nil, "address (IP or CIDR) of a proxy whose --auth-header, --groups-header and X-Forwarded-Proto are believed (repeat or comma-separate)")
	cmd.Flags().StringVar(&auth.groupsHeader, "groups-header", "", "the header in which the proxy lists the user's groups (e.g. X-Forwarded-Groups)")
	cmd.Flags().StringSliceVar(&auth.groupRoles, "group-role", nil, "GROUP=ROLE: the role (viewer or operator) of the members of a group of --groups-header (repeat or comma-separate)")
	cmd.Flags().StringVar(&auth.proxyRole, "proxy-role", string(console.DefaultProxyRole), "the role of a user the proxy names whom no --group-role gives one: viewer, operator, or none (refused)")
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
