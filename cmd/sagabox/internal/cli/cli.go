// Package cli implements the sagabox command: migrations, inspection of
// sagas, outboxes and inboxes, operator actions and their requests, dead
// letters, namespace teardown and benchmarks. Its JSON output is the
// structs of package view. It is a package of its own so that tests run
// the real command in-process.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/sagabox/sagabox/cmd/sagabox/internal/view"
	"github.com/sagabox/sagabox/store"
)

// Exit codes. Scripts can rely on them.
const (
	// ExitOK means the command did what was asked.
	ExitOK = 0
	// ExitError means the command failed (database unreachable, query error).
	ExitError = 1
	// ExitUsage means the command line was wrong.
	ExitUsage = 2
	// ExitNotFound means the saga (or other object) asked for does not exist.
	ExitNotFound = 3
	// ExitRefused means an operator action is not allowed in the saga's
	// current status (e.g. abort of a completed saga).
	ExitRefused = 4
)

// DefaultDatabaseURL is used when neither --database-url nor DATABASE_URL is
// set.
const DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres"

// exitError carries an exit code with an error.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func withCode(code int, err error) error { return &exitError{code: code, err: err} }

type app struct {
	stdout, stderr io.Writer
	databaseURL    string
	schema         string
	json           bool
}

// Run runs the sagabox command with args (without the program name) and
// returns its exit code.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a := &app{stdout: stdout, stderr: stderr}
	root := a.rootCommand()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	err = a.privilegeHint(err)
	code := ExitError
	var ee *exitError
	if errors.As(err, &ee) {
		code = ee.code
	} else if strings.HasPrefix(err.Error(), "unknown command") || strings.HasPrefix(err.Error(), "unknown flag") ||
		strings.Contains(err.Error(), "arg(s)") || strings.Contains(err.Error(), "required flag") ||
		strings.HasPrefix(err.Error(), "invalid argument") {
		// Cobra's own usage errors, before a flag error function runs.
		code = ExitUsage
	}
	if a.json {
		enc := json.NewEncoder(stderr)
		_ = enc.Encode(view.Error{Error: err.Error(), ExitCode: code})
	} else {
		fmt.Fprintln(stderr, "sagabox:", err)
	}
	return code
}

// jsonAnnotation marks a command that prints JSON with --json. Every other
// command refuses --json with a usage error, so that a script never gets a
// table where it asked for JSON.
const jsonAnnotation = "sagabox/json"

// withJSON marks cmd as printing JSON with --json and returns it.
func withJSON(cmd *cobra.Command) *cobra.Command {
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	cmd.Annotations[jsonAnnotation] = "yes"
	return cmd
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "sagabox",
		Short:         "Operate sagabox: migrations, saga inspection, outbox and inbox stats, operator actions, dead letters",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if a.json && cmd.Annotations[jsonAnnotation] == "" {
				return withCode(ExitUsage, fmt.Errorf("%s has no JSON output: drop --json", cmd.CommandPath()))
			}
			return nil
		},
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return withCode(ExitUsage, err) })
	env := os.Getenv("DATABASE_URL")
	if env == "" {
		env = DefaultDatabaseURL
	}
	schema := os.Getenv("SAGABOX_SCHEMA")
	if schema == "" {
		schema = store.DefaultSchema
	}
	root.PersistentFlags().StringVar(&a.databaseURL, "database-url", env, "PostgreSQL URL or keyword/value string, given to pgx as it is; TLS: sslmode=verify-full&sslrootcert=CA.pem[&sslcert=…&sslkey=…] (env DATABASE_URL)")
	root.PersistentFlags().StringVar(&a.schema, "schema", schema, "schema of the service to operate on (env SAGABOX_SCHEMA)")
	root.PersistentFlags().BoolVar(&a.json, "json", false, "print JSON instead of tables (one schema for every command: docs/operations.md)")
	root.AddCommand(a.migrateCommand(), a.outboxCommand(), a.inboxCommand(), a.sagaCommand(), a.opsCommand(),
		a.dlqCommand(), a.namespaceCommand(), a.relayCommand(), a.rolesCommand(), a.benchCommand(), a.uiCommand(), a.versionCommand(),
		a.doctorCommand())
	for _, group := range root.Commands() {
		strictGroup(group)
	}
	return root
}

// strictGroup makes a command that only groups subcommands reject an unknown
// subcommand with a usage error, instead of printing help and succeeding.
func strictGroup(cmd *cobra.Command) {
	if !cmd.HasSubCommands() || cmd.RunE != nil {
		return
	}
	cmd.Args = cobra.ArbitraryArgs
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return cmd.Help()
		}
		return withCode(ExitUsage, fmt.Errorf("unknown command %q for %q; see %q", args[0], cmd.CommandPath(), cmd.CommandPath()+" --help"))
	}
}

// target describes the database of --database-url for messages: host,
// port, user and database from the parsed configuration, never the URL's
// text, so that a password cannot appear in a message.
type target struct{ host, hostname, port, user, database, connString string }

func (t target) String() string {
	return fmt.Sprintf("%s (user %s, database %s)", t.host, t.user, t.database)
}

// connect opens a pool and checks that the database answers. Its errors
// say which of the usual problems it is: the server unreachable, the
// password refused, the role or the database missing.
func (a *app) connect(ctx context.Context) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(a.databaseURL)
	if err != nil {
		// The parser's error may quote the string: say only what is wrong.
		return nil, withCode(ExitUsage, fmt.Errorf("--database-url (or DATABASE_URL): %w", store.ExplainParseError(a.databaseURL, err)))
	}
	cfg.MaxConns = 4
	port := strconv.Itoa(int(cfg.ConnConfig.Port))
	tgt := target{
		host: net.JoinHostPort(cfg.ConnConfig.Host, port), hostname: cfg.ConnConfig.Host, port: port,
		user: cfg.ConnConfig.User, database: cfg.ConnConfig.Database, connString: a.databaseURL,
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open database %s: %w", tgt, err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, connectError(tgt, err)
	}
	return pool, nil
}

// connectError turns a failed connect into the message for its cause.
func connectError(t target, err error) error {
	switch store.ClassifyConnect(err) {
	case store.ConnectAuthFailed:
		return fmt.Errorf("authentication failed for user %s at %s: check the password in --database-url (or DATABASE_URL, or ~/.pgpass)", t.user, t.host)
	case store.ConnectRoleRejected:
		return fmt.Errorf("PostgreSQL at %s refused user %s: the role does not exist or pg_hba.conf does not let it connect; create it (createuser -h %s -p %s %s) or pass another user in --database-url",
			t.host, t.user, t.hostname, t.port, t.user)
	case store.ConnectNoDatabase:
		return fmt.Errorf("database %s does not exist at %s: create it (createdb -h %s -p %s %s) or pass another database in --database-url",
			t.database, t.host, t.hostname, t.port, t.database)
	case store.ConnectCertificate:
		return fmt.Errorf("cannot connect to PostgreSQL %s over TLS: %w", t, store.ExplainCertificate(t.connString, err))
	case store.ConnectPermissionDenied:
		return fmt.Errorf("PostgreSQL at %s refused user %s the database %s: the role has no CONNECT privilege on it; as its owner run GRANT CONNECT ON DATABASE %s TO %s",
			t.host, t.user, t.database, pgx.Identifier{t.database}.Sanitize(), pgx.Identifier{t.user}.Sanitize())
	case store.ConnectUnreachable:
		return fmt.Errorf("cannot reach PostgreSQL at %s (%w); is it running? On a development machine start it with: pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start",
			t.host, err)
	}
	return fmt.Errorf("connect to PostgreSQL %s: %w", t, err)
}

// privilegeHint adds to err, when the server refused a statement for want
// of a privilege, which role was refused in which schema and the grants of
// its part.
func (a *app) privilegeHint(err error) error {
	if !store.IsInsufficientPrivilege(err) || errors.Is(err, store.ErrInsufficientPrivilege) {
		return err
	}
	user := "ROLE"
	if cfg, perr := pgxpool.ParseConfig(a.databaseURL); perr == nil {
		user = cfg.ConnConfig.User
	}
	return fmt.Errorf("%w; role %s may not do this in schema %s: inspection needs the read-only role's grants "+
		"(sagabox roles print --schema %s --role %s --read-only), operator actions the runtime role's (drop --read-only), "+
		"migrations and relay set-up the schema's owner",
		err, user, a.schema, a.schema, user)
}

// openStore connects and returns the store of --schema and its pool.
func (a *app) openStore(ctx context.Context) (*store.Store, *pgxpool.Pool, error) {
	pool, err := a.connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	st, err := store.New(pool, a.schema)
	if err != nil {
		pool.Close()
		return nil, nil, withCode(ExitUsage, err)
	}
	return st, pool, nil
}

// checkSchema returns nil when the migrations of lines are all applied in
// st's schema, else an error that says what the schema is and the
// `sagabox migrate up` line that fixes it.
func (a *app) checkSchema(ctx context.Context, st *store.Store, pool *pgxpool.Pool, lines ...store.Line) error {
	states, err := st.MigrationStates(ctx)
	if err != nil {
		return err
	}
	have := map[store.Line]int{}
	latest := map[store.Line]int{}
	for _, s := range states {
		latest[s.Line] = max(latest[s.Line], s.Version)
		if s.AppliedAt != nil {
			have[s.Line] = max(have[s.Line], s.Version)
		}
	}
	if have[store.LineMessaging] == 0 && have[store.LineSaga] == 0 {
		others := "none"
		if schemas, err := store.ListSchemas(ctx, pool); err == nil && len(schemas) > 0 {
			const shown = 8
			others = strings.Join(schemas[:min(len(schemas), shown)], ", ")
			if len(schemas) > shown {
				others += fmt.Sprintf(" and %d more", len(schemas)-shown)
			}
		}
		fix := fmt.Sprintf("`sagabox migrate up --schema %s` (an orchestrator's schema: both lines)", a.schema)
		if !slices.Contains(lines, store.LineSaga) {
			fix = fmt.Sprintf("`sagabox migrate up --schema %s --line messaging` (a participant's schema; an orchestrator's takes both lines: drop --line)", a.schema)
		}
		return fmt.Errorf("%w: schema %q has no sagabox tables; is --schema right? (schemas with sagabox tables: %s). To create it: %s",
			store.ErrSchemaOutdated, a.schema, others, fix)
	}
	for _, line := range lines {
		if have[line] >= latest[line] {
			continue
		}
		if line == store.LineSaga && have[store.LineSaga] == 0 {
			return fmt.Errorf("%w: schema %q has the messaging line only, as a participant's schema does; sagas live in the orchestrator's schema: pass it with --schema. If %q is an orchestrator's, run `sagabox migrate up --schema %s --line saga`",
				store.ErrSchemaOutdated, a.schema, a.schema, a.schema)
		}
		return fmt.Errorf("%w: schema %q has %s migrations up to version %d of %d; run `sagabox migrate up --schema %s --line %s`",
			store.ErrSchemaOutdated, a.schema, line, have[line], latest[line], a.schema, line)
	}
	return nil
}

// print writes v as JSON with --json, else calls table with a tab writer.
func (a *app) print(v any, table func(w io.Writer)) error {
	if a.json {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	table(tw)
	return tw.Flush()
}

// positive returns a usage error unless n (the value of --flag) is at
// least 1.
func positive(flag string, n int) error {
	if n < 1 {
		return withCode(ExitUsage, fmt.Errorf("--%s %d: want 1 or more", flag, n))
	}
	return nil
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func fmtDuration(d time.Duration) string {
	switch {
	case d == 0:
		return "0s"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	default:
		return d.Round(time.Second).String()
	}
}
