package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/cmd/sagabox/internal/cli"
	"github.com/sagabox/sagabox/cmd/sagabox/internal/view"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/store/driver"
)

// result is one run of the sagabox command.
type result struct {
	code           int
	stdout, stderr string
}

// run runs the sagabox command in-process against the test database.
func run(t *testing.T, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	code := cli.Run(ctx, append([]string{"--database-url", dbtest.URL()}, args...), &out, &errOut)
	return result{code, out.String(), errOut.String()}
}

// sagaIn inserts a saga row of type checkout v1 in db's schema.
func sagaIn(t *testing.T, db *dbtest.DB, status string, current int, steps, lastError, key string) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	rec := driver.SagaRecord{
		ID: uuid.New(), Type: "checkout", Version: 1, Status: status, StartKey: key, Data: []byte(`{"order":"o-1"}`),
		Steps: []byte(steps), Phase: "action", CurrentStep: current, LastError: lastError,
	}
	now := time.Now()
	require.NoError(t, db.InTx(ctx, func(tx pgx.Tx) error {
		_, err := db.SagaStart(ctx, tx, &driver.SagaStart{
			Saga:    rec,
			History: []driver.HistoryRecord{{SagaID: rec.ID, At: now, Event: "started", StepIndex: -1}},
		}, now)
		return err
	}))
	return rec.ID
}

const twoSteps = `[{"name":"reserve","status":"succeeded","attempt":1},{"name":"charge","status":"running","attempt":1}]`

// keys returns every object key in a JSON document, recursively, except
// inside "data" (the saga's own data, whose keys are the user's).
func keys(t *testing.T, doc string) []string {
	t.Helper()
	var v any
	require.NoError(t, json.Unmarshal([]byte(doc), &v), doc)
	var out []string
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				out = append(out, k)
				if k != "data" {
					walk(e)
				}
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(v)
	return out
}

var snake = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

// One JSON schema: snake_case keys everywhere, zero times left out.
func TestSagaShowJSONIsSnakeCaseWithoutZeroTimes(t *testing.T) {
	t.Parallel()
	db := dbtest.Store(t)
	id := sagaIn(t, db, "running", 1, twoSteps, "", "order-1")
	r := run(t, "--schema", db.Store.Schema(), "--json", "saga", "show", id.String())
	require.Equal(t, cli.ExitOK, r.code, r.stderr)
	for _, k := range keys(t, r.stdout) {
		require.Regexp(t, snake, k, "key %q of saga show --json", k)
	}
	require.NotContains(t, r.stdout, "0001-01-01", "zero times are left out")
	var v view.Saga
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &v))
	require.Equal(t, id, v.ID)
	require.Equal(t, "charge", v.CurrentStep)
	require.Len(t, v.Steps, 2)
	require.Equal(t, "started", v.History[0].Event)

	// The same saga by its start key.
	r = run(t, "--schema", db.Store.Schema(), "--json", "saga", "show", "--key", "order-1")
	require.Equal(t, cli.ExitOK, r.code, r.stderr)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &v))
	require.Equal(t, id, v.ID)
	r = run(t, "--schema", db.Store.Schema(), "saga", "show", "--key", "order-2")
	require.Equal(t, cli.ExitNotFound, r.code, r.stderr)
}

func TestEveryJSONOutputIsOneSchema(t *testing.T) {
	t.Parallel()
	db := dbtest.Store(t)
	sagaIn(t, db, "running", 1, twoSteps, "", "order-1")
	schema := db.Store.Schema()
	for _, args := range [][]string{
		{"saga", "list"},
		{"saga", "list", "--key", "order-1"},
		{"saga", "definitions"},
		{"ops", "list", "--all"},
		{"outbox", "stats"},
		{"inbox", "stats"},
		{"outbox", "dead"},
		{"migrate", "list"},
		{"migrate", "up"},
		{"version"},
	} {
		r := run(t, append([]string{"--schema", schema, "--json"}, args...)...)
		require.Equal(t, cli.ExitOK, r.code, "%v: %s", args, r.stderr)
		require.True(t, strings.HasPrefix(strings.TrimSpace(r.stdout), "{"), "%v prints one JSON object: %s", args, r.stdout)
		for _, k := range keys(t, r.stdout) {
			require.Regexp(t, snake, k, "key %q of %v", k, args)
		}
		require.NotContains(t, r.stdout, "0001-01-01", "%v: zero times are left out", args)
	}
	var list view.SagaList
	r := run(t, "--schema", schema, "--json", "saga", "list", "--key", "order-1")
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &list))
	require.Len(t, list.Sagas, 1)
	require.Equal(t, "order-1", list.Sagas[0].StartKey)
}

func TestCommandsWithoutJSONRejectJSON(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"migrate", "print", "saga", "1"},
		{"bench", "relay"},
		{"saga", "timeline", "0190c0de-0000-7000-8000-000000000001"},
	} {
		r := run(t, append([]string{"--json"}, args...)...)
		require.Equal(t, cli.ExitUsage, r.code, "%v: %s", args, r.stderr)
		require.Contains(t, r.stderr, "no JSON output")
		require.Empty(t, r.stdout)
	}
}

func TestFlagValidationIsAUsageError(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"saga", "list", "--limit", "-5"},
		{"saga", "list", "--limit", "x"},
		{"saga", "list", "--status", "sleeping"},
		{"outbox", "dead", "--limit", "0"},
		{"ops", "list", "--limit", "-1"},
		{"ops", "cancel", "abc"},
		{"saga", "show", "not-a-uuid"},
		{"saga", "show"},
		{"saga", "abort", uuid.NewString()},
		{"saga", "nope"},
	} {
		r := run(t, args...)
		require.Equal(t, cli.ExitUsage, r.code, "%v: %s", args, r.stderr)
	}
	// With --json the error is JSON too.
	r := run(t, "--json", "saga", "list", "--limit", "-5")
	require.Equal(t, cli.ExitUsage, r.code)
	var e view.Error
	require.NoError(t, json.Unmarshal([]byte(r.stderr), &e), r.stderr)
	require.Equal(t, cli.ExitUsage, e.ExitCode)
	require.Contains(t, e.Error, "--limit -5")
}

// An abort or retry the saga's status rules out is refused at once, with
// no request recorded.
func TestOperatorActionPreCheckRefusesAtOnce(t *testing.T) {
	t.Parallel()
	db := dbtest.Store(t)
	schema := db.Store.Schema()
	done := sagaIn(t, db, "completed", -1, `[{"name":"reserve","status":"succeeded","attempt":1}]`, "", "")
	for _, action := range []string{"abort", "retry"} {
		r := run(t, "--schema", schema, "saga", action, done.String(), "--reason", "test", "--wait", "1h")
		require.Equal(t, cli.ExitRefused, r.code, r.stderr)
		require.Contains(t, r.stderr, "completed")
	}
	ops, err := db.OperationList(context.Background(), true, 10)
	require.NoError(t, err)
	require.Empty(t, ops, "a refused action records no request")
	r := run(t, "--schema", schema, "saga", "abort", uuid.NewString(), "--reason", "test")
	require.Equal(t, cli.ExitNotFound, r.code, r.stderr)
}

// A request no orchestrator applied within --wait is withdrawn, so that it
// never fires later; --keep leaves it queued, and `ops cancel` withdraws it.
func TestOperatorRequestWithdrawnWhenWaitExpires(t *testing.T) {
	t.Parallel()
	db := dbtest.Store(t)
	schema := db.Store.Schema()
	ctx := context.Background()
	id := sagaIn(t, db, "running", 1, twoSteps, "", "")

	r := run(t, "--schema", schema, "--json", "saga", "abort", id.String(), "--reason", "stuck", "--actor", "alice", "--wait", "200ms")
	require.Equal(t, cli.ExitPending, r.code, r.stderr)
	require.Contains(t, r.stderr, "withdrawn")
	var res view.OperationResult
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &res), r.stdout)
	require.Equal(t, view.OperationWithdrawn, res.Operation.State)
	requireNothingToClaim(t, db)

	r = run(t, "--schema", schema, "--json", "saga", "abort", id.String(), "--reason", "stuck", "--wait", "100ms", "--keep")
	require.Equal(t, cli.ExitPending, r.code, r.stderr)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &res), r.stdout)
	require.Equal(t, view.OperationPending, res.Operation.State)
	n, err := db.OperationCountPending(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)

	var list view.OperationList
	r = run(t, "--schema", schema, "--json", "ops", "list")
	require.Equal(t, cli.ExitOK, r.code, r.stderr)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &list))
	require.Len(t, list.Operations, 1)
	require.Equal(t, res.Operation.ID, list.Operations[0].ID)

	opID := fmt.Sprint(res.Operation.ID)
	r = run(t, "--schema", schema, "ops", "cancel", opID, "--actor", "bob")
	require.Equal(t, cli.ExitOK, r.code, r.stderr)
	requireNothingToClaim(t, db)
	r = run(t, "--schema", schema, "ops", "cancel", opID)
	require.Equal(t, cli.ExitRefused, r.code, "a withdrawn request cannot be cancelled again: %s", r.stderr)
	r = run(t, "--schema", schema, "ops", "cancel", "999999")
	require.Equal(t, cli.ExitNotFound, r.code, r.stderr)

	r = run(t, "--schema", schema, "--json", "ops", "list", "--all")
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &list))
	require.Len(t, list.Operations, 2)
	for _, op := range list.Operations {
		require.Equal(t, view.OperationWithdrawn, op.State)
	}
	require.Equal(t, "bob", list.Operations[0].WithdrawnBy)
}

// requireNothingToClaim checks that an orchestrator of the saga's type finds
// no request to apply.
func requireNothingToClaim(t *testing.T, db *dbtest.DB) {
	t.Helper()
	ctx := context.Background()
	tx := db.Begin(nil)
	defer tx.Rollback(ctx)
	op, err := db.OperationClaim(ctx, tx, []driver.SagaKey{{Type: "checkout", Version: 1}})
	require.NoError(t, err)
	require.Nil(t, op, "a withdrawn request is never applied")
}

// The schema's state decides the advice: no sagabox tables, a participant's
// schema (messaging only) asked for sagas, or an outdated one.
func TestSchemaNotMigratedSaysWhichLine(t *testing.T) {
	t.Parallel()
	empty := "t_empty_" + strings.ReplaceAll(uuid.NewString(), "-", "")[:8]
	r := run(t, "--schema", empty, "saga", "list")
	require.Equal(t, cli.ExitError, r.code)
	require.Contains(t, r.stderr, "has no sagabox tables")
	require.Contains(t, r.stderr, "sagabox migrate up --schema "+empty+"`")
	for _, cmd := range [][]string{{"outbox", "stats"}, {"inbox", "stats"}} {
		r = run(t, append([]string{"--schema", empty}, cmd...)...)
		require.Equal(t, cli.ExitError, r.code, r.stderr)
		require.Contains(t, r.stderr, "sagabox migrate up --schema "+empty+" --line messaging", "%v", cmd)
		require.NotContains(t, r.stderr, "SQLSTATE")
	}

	participant := dbtest.Store(t, store.LineMessaging)
	r = run(t, "--schema", participant.Store.Schema(), "saga", "list")
	require.Equal(t, cli.ExitError, r.code)
	require.Contains(t, r.stderr, "messaging line only")
	require.Contains(t, r.stderr, "--line saga")
	r = run(t, "--schema", participant.Store.Schema(), "outbox", "stats")
	require.Equal(t, cli.ExitOK, r.code, r.stderr)
}

// Connection failures say which: unreachable, the database missing, the
// role missing. A password never appears, and nothing else is rewritten.
func TestConnectErrorsSayWhich(t *testing.T) {
	t.Parallel()
	base, err := url.Parse(dbtest.URL())
	require.NoError(t, err)
	with := func(f func(u *url.URL)) string {
		u := *base
		f(&u)
		return u.String()
	}
	cases := []struct {
		url, want string
		startHint bool
	}{
		{with(func(u *url.URL) { u.Host = "127.0.0.1:1" }), "cannot reach PostgreSQL at 127.0.0.1:1", true},
		{with(func(u *url.URL) { u.Path = "/no_such_db_sagabox" }), "database no_such_db_sagabox does not exist", false},
		{with(func(u *url.URL) { u.User = url.UserPassword("no_such_role_sagabox", "o") }), "refused user no_such_role_sagabox", false},
	}
	for _, c := range cases {
		var out, errOut bytes.Buffer
		code := cli.Run(context.Background(), []string{"--database-url", c.url, "saga", "list"}, &out, &errOut)
		require.Equal(t, cli.ExitError, code, errOut.String())
		require.Contains(t, errOut.String(), c.want)
		require.Equal(t, c.startHint, strings.Contains(errOut.String(), "pg_ctlcluster"), "only an unreachable server gets the start hint: %s", errOut.String())
		require.NotContains(t, errOut.String(), "***", "no text is replaced")
	}
}

// Ctrl-C while waiting withdraws the request too: an interrupted command
// leaves nothing queued to fire later.
func TestOperatorRequestWithdrawnOnInterrupt(t *testing.T) {
	t.Parallel()
	db := dbtest.Store(t)
	id := sagaIn(t, db, "running", 1, twoSteps, "", "")
	ctx, interrupt := context.WithCancel(context.Background())
	defer interrupt()
	var out, errOut bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- cli.Run(ctx, []string{"--database-url", dbtest.URL(), "--schema", db.Store.Schema(),
			"saga", "retry", id.String(), "--reason", "resend", "--wait", "1h"}, &out, &errOut)
	}()
	require.Eventually(t, func() bool {
		n, err := db.OperationCountPending(context.Background())
		return err == nil && n == 1
	}, 60*time.Second, 50*time.Millisecond, "the request is recorded")
	interrupt()
	var code int
	select {
	case code = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the command did not return after the interrupt")
	}
	require.Equal(t, cli.ExitPending, code, errOut.String())
	require.Contains(t, errOut.String(), "interrupted")
	ops, err := db.OperationList(context.Background(), true, 10)
	require.NoError(t, err)
	require.Len(t, ops, 1)
	require.False(t, ops[0].WithdrawnAt.IsZero(), "the interrupted request is withdrawn")
	requireNothingToClaim(t, db)
}

// A bulk action selects sagas by filter, prints what it would do without
// --yes (recording nothing), and with --yes records one request per saga
// whose status the action applies to.
func TestSagaBulkDryRunThenRequests(t *testing.T) {
	t.Parallel()
	db := dbtest.Store(t)
	schema := db.Store.Schema()
	var running []uuid.UUID
	for i := range 3 {
		running = append(running, sagaIn(t, db, "running", 1, twoSteps, "", fmt.Sprintf("bulk-%d", i)))
	}
	sagaIn(t, db, "completed", -1, `[{"name":"reserve","status":"succeeded","attempt":1}]`, "", "bulk-done")
	sagaIn(t, db, "running", 1, twoSteps, "", "other-1")

	r := run(t, "--schema", schema, "saga", "bulk", "cancel", "--reason", "test")
	require.Equal(t, cli.ExitUsage, r.code, "a bulk action needs a filter: %s", r.stderr)

	r = run(t, "--schema", schema, "--json", "saga", "bulk", "cancel", "--type", "checkout", "--key-prefix", "bulk-", "--reason", "supplier gone")
	require.Equal(t, cli.ExitOK, r.code, r.stderr)
	var dry view.Bulk
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &dry))
	require.True(t, dry.DryRun)
	require.Equal(t, 4, dry.Matched, "the three running sagas and the completed one")
	require.Equal(t, 3, dry.Applicable, "a completed saga cannot be cancelled")
	require.ElementsMatch(t, running, dry.First)
	require.Empty(t, dry.Requests)
	ops, err := db.OperationList(context.Background(), true, 10)
	require.NoError(t, err)
	require.Empty(t, ops, "a dry run records nothing")

	r = run(t, "--schema", schema, "--json", "saga", "bulk", "cancel", "--type", "checkout", "--key-prefix", "bulk-", "--reason", "supplier gone", "--yes", "--actor", "ops")
	require.Equal(t, cli.ExitOK, r.code, r.stderr)
	var done view.Bulk
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &done))
	require.False(t, done.DryRun)
	require.Len(t, done.Requests, 3)
	ops, err = db.OperationList(context.Background(), false, 10)
	require.NoError(t, err)
	require.Len(t, ops, 3)
	var ids []uuid.UUID
	for _, op := range ops {
		require.Equal(t, "cancel", op.Action)
		require.Equal(t, "ops", op.Actor)
		require.Equal(t, "supplier gone", op.Reason)
		ids = append(ids, op.SagaID)
	}
	require.ElementsMatch(t, running, ids)
}

// A bulk restart selects failed and compensated sagas only, and records
// its step, version and data as the request's params, which the
// orchestrator reads as orchestrator.RestartOpts. Bad restart flags are
// usage errors.
func TestSagaBulkRestartRecordsParams(t *testing.T) {
	t.Parallel()
	db := dbtest.Store(t)
	schema := db.Store.Schema()
	compensated := sagaIn(t, db, "compensated", -1, `[{"name":"reserve","status":"compensated","attempt":1}]`, "declined", "restart-1")
	sagaIn(t, db, "running", 1, twoSteps, "", "restart-2")

	for _, args := range [][]string{
		{"saga", "restart", compensated.String(), "--reason", "x"},
		{"saga", "restart", compensated.String(), "--reason", "x", "--from", "reserve", "--data", "{not json"},
		{"saga", "restart", compensated.String(), "--reason", "x", "--from", "reserve", "--to-version", "-2"},
		{"saga", "bulk", "restart", "--type", "checkout", "--reason", "x"},
	} {
		r := run(t, append([]string{"--schema", schema}, args...)...)
		require.Equal(t, cli.ExitUsage, r.code, "%v: %s", args, r.stderr)
	}
	r := run(t, "--schema", schema, "saga", "restart", sagaIn(t, db, "completed", -1, `[{"name":"reserve","status":"succeeded","attempt":1}]`, "", "").String(),
		"--from", "reserve", "--reason", "x", "--wait", "1h")
	require.Equal(t, cli.ExitRefused, r.code, r.stderr)
	require.Contains(t, r.stderr, "only a failed or compensated saga can be restarted, this one is completed")

	r = run(t, "--schema", schema, "--json", "saga", "bulk", "restart", "--type", "checkout", "--key-prefix", "restart-",
		"--from", "reserve", "--to-version", "2", "--data", `{"order":"o-2"}`, "--reason", "supplier back", "--yes", "--actor", "ops")
	require.Equal(t, cli.ExitOK, r.code, r.stderr)
	var out view.Bulk
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &out))
	require.Equal(t, 2, out.Matched)
	require.Equal(t, 1, out.Applicable, "a running saga cannot be restarted")
	ops, err := db.OperationList(context.Background(), false, 10)
	require.NoError(t, err)
	require.Len(t, ops, 1)
	require.Equal(t, "restart", ops[0].Action)
	require.Equal(t, compensated, ops[0].SagaID)
	var params orchestrator.RestartOpts
	require.NoError(t, json.Unmarshal(ops[0].Params, &params))
	require.Equal(t, "reserve", params.From)
	require.Equal(t, 2, params.Version)
	require.JSONEq(t, `{"order":"o-2"}`, string(params.Data), "jsonb keeps the data, not its spacing")
}
