package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/examples/checkout/orders"
	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
)

// The sagabox command's exit codes (docs/operations.md).
const (
	exitOK       = 0
	exitError    = 1
	exitUsage    = 2
	exitNotFound = 3
	exitRefused  = 4
	exitPending  = 5
)

var (
	buildCLI sync.Once
	cliPath  string
	cliErr   error
)

// sagabox runs the sagabox command, built once per test binary, and returns
// its exit code and output.
func sagabox(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	buildCLI.Do(func() {
		dir, err := os.MkdirTemp("", "sagabox-cli-")
		if err != nil {
			cliErr = err
			return
		}
		cliPath = filepath.Join(dir, "sagabox")
		out, err := exec.Command("go", "build", "-o", cliPath, "github.com/sagabox/sagabox/cmd/sagabox").CombinedOutput()
		if err != nil {
			cliErr = fmt.Errorf("go build sagabox: %w: %s", err, out)
		}
	})
	require.NoError(t, cliErr)
	var out, errOut bytes.Buffer
	cmd := exec.Command(cliPath, args...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), out.String(), errOut.String()
	}
	require.NoError(t, err)
	return 0, out.String(), errOut.String()
}

type listed struct {
	Sagas []struct {
		ID          string      `json:"id"`
		Type        string      `json:"type"`
		Status      saga.Status `json:"status"`
		CurrentStep string      `json:"current_step"`
		StartKey    string      `json:"start_key"`
	} `json:"sagas"`
	Cursor string `json:"next_cursor"`
}

// The CLI against a database populated by the example: listing, showing,
// stats, JSON output and exit codes; retry and abort applied by a running
// orchestrator change the saga and write history.
func TestCLIOnCheckoutDatabase(t *testing.T) {
	t.Parallel()
	flags := isolated(t)
	prefix := flags[3]
	var out, errOut bytes.Buffer
	require.Equal(t, 0, run(context.Background(), append(flags, "-orders", "6", "-fail-rate", "0.5"), &out, &errOut), errOut.String())
	db := []string{"--database-url", flags[1], "--schema", prefix + "orders"}

	// list, as JSON and as a table.
	code, stdout, stderr := sagabox(t, append([]string{"saga", "list", "--json"}, db...)...)
	require.Equal(t, exitOK, code, stderr)
	var all listed
	require.NoError(t, json.Unmarshal([]byte(stdout), &all))
	require.Len(t, all.Sagas, 6)
	counts := map[saga.Status]int{}
	for _, s := range all.Sagas {
		require.Equal(t, "checkout", s.Type)
		counts[s.Status]++
	}
	require.Equal(t, 6, counts[saga.StatusCompleted]+counts[saga.StatusCompensated])
	require.Positive(t, counts[saga.StatusCompensated])

	code, stdout, _ = sagabox(t, append([]string{"saga", "list", "--status", "compensated", "--limit", "1", "--json"}, db...)...)
	require.Equal(t, exitOK, code)
	var page listed
	require.NoError(t, json.Unmarshal([]byte(stdout), &page))
	require.Len(t, page.Sagas, 1)
	require.Equal(t, saga.StatusCompensated, page.Sagas[0].Status)
	if counts[saga.StatusCompensated] > 1 {
		require.NotEmpty(t, page.Cursor, "more compensated sagas remain")
	}
	compensated := page.Sagas[0].ID

	code, stdout, _ = sagabox(t, append([]string{"saga", "list"}, db...)...)
	require.Equal(t, exitOK, code)
	require.Contains(t, stdout, "STATUS")
	require.Contains(t, stdout, compensated)

	// show: data, steps and timeline.
	code, stdout, _ = sagabox(t, append([]string{"saga", "show", compensated}, db...)...)
	require.Equal(t, exitOK, code)
	for _, want := range []string{"checkout v1", "compensated", "reserve-stock", "TIME", `"order_id"`} {
		require.Contains(t, stdout, want)
	}
	// Rejected by inventory or payment, or the provider's confirmation did
	// not come in time.
	require.Regexp(t, `step-rejected|timed-out`, stdout)
	code, stdout, _ = sagabox(t, append([]string{"saga", "show", compensated, "--json"}, db...)...)
	require.Equal(t, exitOK, code)
	var shown struct {
		Status  saga.Status         `json:"status"`
		History []saga.HistoryEntry `json:"history"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &shown))
	require.Equal(t, saga.StatusCompensated, shown.Status)
	require.NotEmpty(t, shown.History)

	// show and list by start key (the order id).
	key := page.Sagas[0].StartKey
	require.NotEmpty(t, key, "the example starts its sagas with the order id as start key")
	code, stdout, stderr = sagabox(t, append([]string{"saga", "show", "--key", key}, db...)...)
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, stdout, compensated)
	require.Regexp(t, `start key +`+regexp.QuoteMeta(key), stdout)
	code, stdout, _ = sagabox(t, append([]string{"saga", "show", "--key", key, "--type", "checkout", "--json"}, db...)...)
	require.Equal(t, exitOK, code)
	require.Contains(t, stdout, compensated)
	code, _, _ = sagabox(t, append([]string{"saga", "show", "--key", "no-such-order"}, db...)...)
	require.Equal(t, exitNotFound, code)
	code, stdout, _ = sagabox(t, append([]string{"saga", "list", "--key", key, "--json"}, db...)...)
	require.Equal(t, exitOK, code)
	var byKey listed
	require.NoError(t, json.Unmarshal([]byte(stdout), &byKey))
	require.Len(t, byKey.Sagas, 1)
	require.Equal(t, compensated, byKey.Sagas[0].ID)
	code, stdout, _ = sagabox(t, append([]string{"saga", "list", "--key", key}, db...)...)
	require.Equal(t, exitOK, code)
	require.Contains(t, stdout, "START KEY")
	require.Contains(t, stdout, key)

	// stats of the services' outboxes and inboxes.
	code, stdout, _ = sagabox(t, "outbox", "stats", "--json", "--database-url", flags[1], "--schema", prefix+"inventory")
	require.Equal(t, exitOK, code)
	var ostats struct {
		Schemas []struct {
			Schema  string `json:"schema"`
			Backlog int64  `json:"backlog"`
		} `json:"schemas"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &ostats))
	require.Equal(t, []struct {
		Schema  string `json:"schema"`
		Backlog int64  `json:"backlog"`
	}{{prefix + "inventory", 0}}, ostats.Schemas, "every reply was published")
	code, stdout, _ = sagabox(t, "inbox", "stats", "--json", "--database-url", flags[1], "--schema", prefix+"inventory")
	require.Equal(t, exitOK, code)
	var istats struct {
		Schemas []struct {
			Processed  int64 `json:"processed"`
			Duplicates int64 `json:"duplicates"`
		} `json:"schemas"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &istats))
	require.Len(t, istats.Schemas, 1)
	require.GreaterOrEqual(t, istats.Schemas[0].Processed, int64(6), "every reserve (and release) was recorded")

	// Dead outbox rows: listed, retried, and an unknown id reported.
	inv := []string{"--database-url", flags[1], "--schema", prefix + "inventory"}
	pool := dbtest.Pool(t)
	var deadID int64
	require.NoError(t, pool.QueryRow(context.Background(), fmt.Sprintf(`INSERT INTO %q.sagabox_outbox
		(message_id, ordering_key, kind, type, routing_key, payload, publish_attempts, published_at, dead_at, last_error)
		VALUES (gen_random_uuid(), 'k', 'reply-failure', 'inventory.reserve', 'gone', '{}', 10, now(), now(), 'unroutable after 10 attempts: test')
		RETURNING id`, prefix+"inventory")).Scan(&deadID))
	code, stdout, stderr = sagabox(t, append([]string{"outbox", "dead", "--json"}, inv...)...)
	require.Equal(t, exitOK, code, stderr)
	var dead struct {
		Messages []struct {
			ID     int64  `json:"id"`
			Reason string `json:"reason"`
		} `json:"messages"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &dead))
	require.Equal(t, []struct {
		ID     int64  `json:"id"`
		Reason string `json:"reason"`
	}{{deadID, "unroutable after 10 attempts: test"}}, dead.Messages)
	code, _, stderr = sagabox(t, append([]string{"outbox", "retry-dead", "--id", fmt.Sprint(deadID), "--delete"}, inv...)...)
	require.Equal(t, exitOK, code, stderr)
	code, _, _ = sagabox(t, append([]string{"outbox", "retry-dead", "--id", fmt.Sprint(deadID)}, inv...)...)
	require.Equal(t, exitNotFound, code, "the deleted row is gone")

	// Exit codes scripts rely on.
	code, _, stderr = sagabox(t, append([]string{"saga", "show", "01890000-0000-7000-8000-000000000000"}, db...)...)
	require.Equal(t, exitNotFound, code)
	require.Contains(t, stderr, "does not exist")
	code, _, _ = sagabox(t, append([]string{"saga", "show", "not-a-uuid"}, db...)...)
	require.Equal(t, exitUsage, code)
	code, _, _ = sagabox(t, append([]string{"saga", "list", "--status", "sleeping"}, db...)...)
	require.Equal(t, exitUsage, code)
	code, _, _ = sagabox(t, "saga", "frobnicate")
	require.Equal(t, exitUsage, code)
	code, _, stderr = sagabox(t, "outbox", "stats", "--database-url", "postgres://u:s3cret@127.0.0.1:1/x")
	require.Equal(t, exitError, code)
	require.Contains(t, stderr, "cannot reach PostgreSQL at 127.0.0.1:1")
	require.NotContains(t, stderr, "s3cret")

	// An orchestrator of the example's orders service, with inventory down:
	// a new saga waits at its first step.
	o, err := parseFlags(append(flags, "-service", "orders"), io.Discard)
	require.NoError(t, err)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	a, err := newApp(context.Background(), o, io.Discard, quiet)
	require.NoError(t, err)
	defer a.close()
	orch, err := a.orchestrator()
	require.NoError(t, err)
	require.NoError(t, orch.Register(a.orders.Saga))
	stuck := func(id string) *orchestrator.Started {
		started, err := a.orders.Place(context.Background(), a.pool, orch, orders.Order{
			ID: id, Customer: "nobody", SKU: "none", Qty: 1, AmountCents: 100, Address: "x",
		})
		require.NoError(t, err)
		return started
	}
	toRetry, toAbort, toTerminate := stuck(prefix+"retry"), stuck(prefix+"abort"), stuck(prefix+"terminate")

	// No orchestrator runs yet: an operator request waits, says so, and is
	// withdrawn when its wait expires.
	code, _, stderr = sagabox(t, append([]string{"saga", "abort", toAbort.ID.String(), "--reason", "test", "--wait", "300ms"}, db...)...)
	require.Equal(t, exitPending, code, stderr)
	require.Contains(t, stderr, "no orchestrator applied it")

	stop := testkit.Run(t, orch.Run)
	defer func() { require.NoError(t, stop()) }()

	// The compensated saga cannot be aborted: refused at once, exit 4.
	code, _, stderr = sagabox(t, append([]string{"saga", "abort", compensated, "--reason", "test"}, db...)...)
	require.Equal(t, exitRefused, code, stderr)

	code, stdout, stderr = sagabox(t, append([]string{"saga", "retry", toRetry.ID.String(), "--reason", "inventory was down", "--actor", "carol"}, db...)...)
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, stdout, "retry of saga")
	code, stdout, stderr = sagabox(t, append([]string{"saga", "abort", toAbort.ID.String(), "--reason", "customer cancelled", "--actor", "dave"}, db...)...)
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, stdout, "status is now compensating")
	code, stdout, stderr = sagabox(t, append([]string{"saga", "terminate", toTerminate.ID.String(), "--reason", "fraud", "--actor", "erin"}, db...)...)
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, stdout, "status is now terminated")
	code, _, stderr = sagabox(t, append([]string{"saga", "cancel", toTerminate.ID.String(), "--reason", "too late"}, db...)...)
	require.Equal(t, exitRefused, code, stderr)
	code, stdout, _ = sagabox(t, append([]string{"saga", "list", "--status", "terminated", "--json"}, db...)...)
	require.Equal(t, exitOK, code)
	var terminated listed
	require.NoError(t, json.Unmarshal([]byte(stdout), &terminated))
	require.Len(t, terminated.Sagas, 1)
	require.Equal(t, toTerminate.ID.String(), terminated.Sagas[0].ID)

	hasEntry := func(id string, event saga.HistoryEvent, actor, detail string) bool {
		code, stdout, _ := sagabox(t, append([]string{"saga", "show", id, "--json"}, db...)...)
		require.Equal(t, exitOK, code)
		var s struct {
			History []saga.HistoryEntry `json:"history"`
		}
		require.NoError(t, json.Unmarshal([]byte(stdout), &s))
		for _, h := range s.History {
			if h.Event == event && h.Actor == actor && strings.Contains(h.Detail, detail) {
				return true
			}
		}
		return false
	}
	require.True(t, hasEntry(toRetry.ID.String(), saga.HistoryRetried, "carol", "inventory was down"))
	// abort is the former name of cancel.
	require.True(t, hasEntry(toAbort.ID.String(), saga.HistoryCancelled, "dave", "customer cancelled"))
	require.True(t, hasEntry(toTerminate.ID.String(), saga.HistoryTerminated, "erin", "fraud"))
	retried, err := orch.Get(context.Background(), toRetry.ID)
	require.NoError(t, err)
	require.Equal(t, 2, retried.Steps[0].Attempt, "the stuck command was sent again")
}
