// Package cli implements the sagabox command: migrations, inspection of
// sagas, outboxes and inboxes, operator actions and benchmarks. It is a
// package of its own so that tests run the real command in-process.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

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
	fmt.Fprintln(stderr, "sagabox:", redact(err.Error(), a.databaseURL))
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	if strings.HasPrefix(err.Error(), "unknown command") || strings.HasPrefix(err.Error(), "unknown flag") ||
		strings.Contains(err.Error(), "arg(s)") || strings.Contains(err.Error(), "required flag") ||
		strings.HasPrefix(err.Error(), "invalid argument") {
		return ExitUsage
	}
	return ExitError
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "sagabox",
		Short:         "Operate sagabox: migrations, saga inspection, outbox and inbox stats, operator actions",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	env := os.Getenv("DATABASE_URL")
	if env == "" {
		env = DefaultDatabaseURL
	}
	schema := os.Getenv("SAGABOX_SCHEMA")
	if schema == "" {
		schema = store.DefaultSchema
	}
	root.PersistentFlags().StringVar(&a.databaseURL, "database-url", env, "PostgreSQL URL (env DATABASE_URL)")
	root.PersistentFlags().StringVar(&a.schema, "schema", schema, "schema of the service to operate on (env SAGABOX_SCHEMA)")
	root.PersistentFlags().BoolVar(&a.json, "json", false, "print JSON instead of tables")
	root.AddCommand(a.migrateCommand(), a.outboxCommand(), a.inboxCommand(), a.sagaCommand(), a.relayCommand(), a.benchCommand())
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

// connect opens a pool and checks that the database answers.
func (a *app) connect(ctx context.Context) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(a.databaseURL)
	if err != nil {
		return nil, withCode(ExitUsage, fmt.Errorf("--database-url is not a valid PostgreSQL URL"))
	}
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("cannot reach PostgreSQL at %s:%d (%w); is it running? On a development machine start it with: pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start",
			cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
	}
	return pool, nil
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

// redact removes the password of url from s.
func redact(s, rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil || u.User == nil {
		return s
	}
	if pw, ok := u.User.Password(); ok && pw != "" {
		s = strings.ReplaceAll(s, pw, "***")
	}
	return s
}

func fmtTime(t *time.Time) string {
	if t == nil || t.IsZero() {
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
