package cli_test

import (
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/cmd/sagabox/internal/cli"
	"github.com/sagabox/sagabox/cmd/sagabox/internal/view"
	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
)

type order struct {
	ID string `json:"id"`
}

type paid struct {
	Reference string `json:"reference"`
}

var (
	reserveCmd = saga.NewCommand[order, saga.None]("inventory.reserve")
	releaseCmd = saga.NewCommand[order, saga.None]("inventory.release")
	chargeCmd  = saga.NewCommand[order, saga.None]("payment.charge")
	refundCmd  = saga.NewCommand[order, saga.None]("payment.refund")
	notifyCmd  = saga.NewCommand[order, saga.None]("mail.notify")
	paidEvent  = saga.NewEventType[paid]("payment.confirmed")
)

func sameOrder(o *order) order { return *o }

// shopV1 reserves and charges; shopV2 adds a parallel group, a wait and a
// local step.
func shopV1() *saga.Definition[order] {
	return saga.MustNew("shop", 1,
		saga.Step("reserve", saga.Invoke(reserveCmd, sameOrder, nil), saga.Compensate(releaseCmd, sameOrder), saga.WithTimeout[order](time.Hour)),
		saga.Step("charge", saga.Invoke(chargeCmd, sameOrder, nil)),
	)
}

func shopV2() *saga.Definition[order] {
	return saga.MustNew("shop", 2,
		saga.Step("reserve", saga.Invoke(reserveCmd, sameOrder, nil), saga.Compensate(releaseCmd, sameOrder),
			saga.WithTimeout[order](time.Hour), saga.WithRetry[order](saga.RetryPolicy{MaxAttempts: 3})),
		saga.Parallel("pay", saga.Step("charge", saga.Invoke(chargeCmd, sameOrder, nil), saga.Compensate(refundCmd, sameOrder)),
			saga.Step("notify", saga.Invoke(notifyCmd, sameOrder, nil))),
		saga.WaitEvent("await-payment", paidEvent, nil, saga.WithTimeout[order](time.Hour)),
		saga.LocalStep("mark", func(context.Context, *order) error { return nil }),
	)
}

// svgElements parses svg strictly and returns each element's name and
// attributes.
func svgElements(t *testing.T, svg string) []xml.StartElement {
	t.Helper()
	d := xml.NewDecoder(strings.NewReader(svg))
	d.Strict = true
	var out []xml.StartElement
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err, "not well-formed SVG:\n%s", svg)
		if e, ok := tok.(xml.StartElement); ok {
			out = append(out, e.Copy())
		}
	}
}

func attr(e xml.StartElement, name string) string {
	for _, a := range e.Attr {
		if a.Name.Local == name {
			return a.Value
		}
	}
	return ""
}

// A running orchestrator records its definitions' shapes; the CLI lists
// them and draws them in every format, the latest version by default, and
// draws a saga's graph (its current step highlighted) and its timeline. An
// unknown name or version is a clear not-found error.
func TestGraphAndTimelineOfRecordedDefinitions(t *testing.T) {
	t.Parallel()
	db := dbtest.Store(t)
	schema := db.Store.Schema()
	broker := amqptest.NewBroker(t, amqptest.Config(t))
	c, err := orchestrator.NewClient(orchestrator.Config{
		Pool: db.Pool, Schema: schema, Service: "shop", Broker: broker, Definitions: []saga.Runner{shopV1(), shopV2()},
		StopTimeout: 10 * time.Second, Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	testkit.Run(t, c.Run)

	// The definitions, as the orchestrator recorded them.
	var list view.DefinitionList
	require.Eventually(t, func() bool {
		r := run(t, "--schema", schema, "--json", "saga", "definitions")
		return r.code == cli.ExitOK && json.Unmarshal([]byte(r.stdout), &list) == nil && len(list.Definitions) == 2
	}, 30*time.Second, 50*time.Millisecond, "the orchestrator records its definitions when it starts")
	require.Equal(t, "shop", list.Definitions[0].Type)
	require.Equal(t, []int{1, 2}, []int{list.Definitions[0].Version, list.Definitions[1].Version})
	require.Equal(t, 5, list.Definitions[1].Steps)
	require.Equal(t, shopV2().Shape(), list.Definitions[1].Shape)
	r := run(t, "--schema", schema, "saga", "definitions")
	require.Equal(t, cli.ExitOK, r.code, r.stderr)
	require.Regexp(t, `shop\s+2\s+5\s`, r.stdout)

	// The latest version by default, in each format.
	r = run(t, "--schema", schema, "saga", "graph", "shop")
	require.Equal(t, cli.ExitOK, r.code, r.stderr)
	var steps []string
	for _, e := range svgElements(t, r.stdout) {
		if e.Name.Local == "g" && strings.HasPrefix(attr(e, "class"), "node ") {
			steps = append(steps, attr(e, "data-step"))
		}
	}
	require.Equal(t, []string{"reserve", "charge", "notify", "await-payment", "mark"}, steps)
	r = run(t, "--schema", schema, "saga", "graph", "shop", "--format", "dot")
	require.Equal(t, cli.ExitOK, r.code, r.stderr)
	require.True(t, strings.HasPrefix(r.stdout, `digraph "saga shop v2" {`), r.stdout)
	require.Contains(t, r.stdout, "subgraph cluster_1")
	r = run(t, "--schema", schema, "saga", "graph", "shop", "--version", "1", "--format", "mermaid")
	require.Equal(t, cli.ExitOK, r.code, r.stderr)
	require.True(t, strings.HasPrefix(r.stdout, "flowchart TB\n"), r.stdout)
	require.Contains(t, r.stdout, `start(("shop v1"))`)
	require.NotContains(t, r.stdout, "notify", "version 1 has no notify step")
	var one view.Definition
	r = run(t, "--schema", schema, "--json", "saga", "graph", "shop", "--version", "1")
	require.Equal(t, cli.ExitOK, r.code, r.stderr)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &one))
	require.Equal(t, shopV1().Shape(), one.Shape)
	for _, k := range keys(t, r.stdout) {
		require.Regexp(t, snake, k, "key %q of saga graph --json", k)
	}

	// Unknown names and versions, and bad flags.
	r = run(t, "--schema", schema, "saga", "graph", "shipping")
	require.Equal(t, cli.ExitNotFound, r.code, r.stderr)
	require.Contains(t, r.stderr, `no saga definition "shipping" is recorded in schema `+schema+"; recorded: shop (v1, v2)")
	r = run(t, "--schema", schema, "saga", "graph", "shop", "--version", "9")
	require.Equal(t, cli.ExitNotFound, r.code, r.stderr)
	require.Contains(t, r.stderr, `saga definition "shop" has no version 9 recorded in schema `+schema+"; recorded versions: 1, 2")
	for _, args := range [][]string{
		{"saga", "graph", "shop", "--format", "png"},
		{"saga", "graph", "shop", "--version", "-1"},
		{"saga", "graph"},
		{"saga", "graph", "shop", "--saga", "0190c0de-0000-7000-8000-000000000001"},
		{"saga", "graph", "--saga", "nope"},
		{"saga", "timeline", "0190c0de-0000-7000-8000-000000000001", "--format", "png"},
		{"saga", "timeline"},
	} {
		r = run(t, append([]string{"--schema", schema}, args...)...)
		require.Equal(t, cli.ExitUsage, r.code, "%v: %s", args, r.stderr)
	}
	r = run(t, "--schema", schema, "saga", "timeline", "0190c0de-0000-7000-8000-000000000001")
	require.Equal(t, cli.ExitNotFound, r.code, r.stderr)

	// A saga waiting on its first step: nobody consumes inventory.reserve.
	tx, err := db.Pool.Begin(context.Background())
	require.NoError(t, err)
	st, err := orchestrator.Start(context.Background(), c, tx, shopV2(), order{ID: "o-1"}, &orchestrator.StartOpts{StartKey: "o-1"})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(context.Background()))

	r = run(t, "--schema", schema, "saga", "graph", "--saga", st.ID.String())
	require.Equal(t, cli.ExitOK, r.code, r.stderr)
	var current []string
	for _, e := range svgElements(t, r.stdout) {
		if e.Name.Local == "g" && strings.Contains(" "+attr(e, "class")+" ", " current ") {
			current = append(current, attr(e, "data-step")+" "+attr(e, "data-status"))
		}
	}
	require.Equal(t, []string{"reserve running"}, current, "the saga's current step is highlighted")

	r = run(t, "--schema", schema, "saga", "timeline", "--key", "o-1")
	require.Equal(t, cli.ExitOK, r.code, r.stderr)
	var bars []string
	for _, e := range svgElements(t, r.stdout) {
		if e.Name.Local == "rect" && strings.HasPrefix(attr(e, "class"), "bar ") {
			bars = append(bars, attr(e, "class"))
		}
	}
	require.Equal(t, []string{"bar attempt open"}, bars, "the first attempt, in flight")

	// A schema where no orchestrator ran.
	empty := dbtest.Store(t)
	r = run(t, "--schema", empty.Store.Schema(), "saga", "graph", "shop")
	require.Equal(t, cli.ExitNotFound, r.code, r.stderr)
	require.Contains(t, r.stderr, "no saga definition is recorded in schema "+empty.Store.Schema())
}
