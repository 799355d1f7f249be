package cli_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/cmd/sagabox/internal/cli"
	"github.com/sagabox/sagabox/cmd/sagabox/internal/view"
	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store/driver"
	"github.com/sagabox/sagabox/transport"
)

// recordDefinitions runs an orchestrator of defs on db until it has
// recorded their shapes, then stops it.
func recordDefinitions(t *testing.T, db *dbtest.DB, broker transport.Broker, defs ...saga.Runner) {
	t.Helper()
	c, err := orchestrator.NewClient(orchestrator.Config{
		Pool: db.Pool, Schema: db.Store.Schema(), Service: "shop", Broker: broker, Definitions: defs,
		StopTimeout: 10 * time.Second, Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	require.Eventually(t, func() bool {
		got, err := c.Definitions(context.Background())
		return err == nil && len(got) == len(defs)
	}, 30*time.Second, 20*time.Millisecond, "the orchestrator records its definitions when it starts")
	cancel()
	require.NoError(t, <-done)
}

// doctor runs `sagabox doctor --json` and decodes its report.
func doctor(t *testing.T, args ...string) (int, view.Doctor) {
	t.Helper()
	r := run(t, append([]string{"--json", "doctor"}, args...)...)
	var d view.Doctor
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &d), "stdout %q, stderr %q", r.stdout, r.stderr)
	return r.code, d
}

// `sagabox doctor` finds, from outside, the commands of the recorded
// definitions that no queue takes (naming the saga type, the step and the
// phase), the sagas that wait past their deadline for an unpublished
// command and the commands waiting in the outbox, and exits 6; with
// nothing to fix it exits 0.
func TestDoctorFindsCommandsNoQueueTakes(t *testing.T) {
	t.Parallel()
	db := dbtest.Store(t)
	schema := db.Store.Schema()
	bcfg := amqptest.Config(t)
	broker := amqptest.NewBroker(t, bcfg)
	ctx, cancel := context.WithTimeout(context.Background(), amqptest.Timeout)
	defer cancel()
	// Inventory is deployed; payment and mail are not.
	require.NoError(t, broker.Declare(ctx, transport.QueueSpec{Name: "inventory", Commands: []string{reserveCmd.Name(), releaseCmd.Name()}}))
	recordDefinitions(t, db, broker, shopV1(), shopV2())
	brokerArgs := []string{"--schema", schema, "--amqp-url", bcfg.URL, "--namespace", bcfg.Namespace, "--queue", "inventory"}

	code, d := doctor(t, brokerArgs...)
	require.Equal(t, cli.ExitFindings, code)
	require.Equal(t, schema, d.Schema)
	var routes []view.Finding
	for _, f := range d.Findings {
		require.Equal(t, "routes", f.Check, "nothing else to find: %+v", f)
		f.Problem, f.Fix = "", ""
		routes = append(routes, f)
	}
	require.Equal(t, []view.Finding{
		{Check: "routes", SagaType: "shop", Version: 2, Step: "charge", Phase: "action", RoutingKey: "payment.charge"},
		{Check: "routes", SagaType: "shop", Version: 2, Step: "charge", Phase: "compensation", RoutingKey: "payment.refund"},
		{Check: "routes", SagaType: "shop", Version: 2, Step: "notify", Phase: "action", RoutingKey: "mail.notify"},
	}, routes, "the latest version's commands without a queue")
	checks := map[string]string{}
	for _, c := range d.Checks {
		checks[c.Check] = c.Result
	}
	require.Equal(t, "2 of 5 commands of 1 definitions have a queue (namespace "+bcfg.Namespace+")", checks["routes"])
	require.Equal(t, "none (the relay polls)", checks["relay-slot"])
	require.Equal(t, "0 messages in 1 queues", checks["dead-letters"])

	// The table says what to do.
	r := run(t, append([]string{"doctor"}, brokerArgs...)...)
	require.Equal(t, cli.ExitFindings, r.code, r.stderr)
	require.Contains(t, r.stdout, `[routes] no queue takes action "payment.charge" of saga shop v2, step "charge": each saga that reaches the step waits there`)
	require.Contains(t, r.stdout, "fix: deploy the participant that handles it")
	require.Contains(t, r.stderr, "3 finding(s) in schema "+schema)

	// A saga has waited ten minutes for a command no queue takes.
	written := time.Now().Add(-10 * time.Minute)
	rec := driver.SagaRecord{ID: uuid.New(), Type: "shop", Version: 2, Status: "running", Data: []byte(`{}`), Steps: []byte(`[]`), Phase: "action"}
	require.NoError(t, db.InTx(ctx, func(tx pgx.Tx) error {
		_, err := db.SagaStart(ctx, tx, &driver.SagaStart{Saga: rec, Messages: []message.Message{{
			Envelope: message.Envelope{Type: chargeCmd.Name(), Kind: message.KindCommand, SagaID: rec.ID, Step: "charge", ReplyTo: "shop"},
			Payload:  []byte(`{}`),
		}}}, written)
		return err
	}))
	code, d = doctor(t, "--schema", schema, "--amqp-url", bcfg.URL, "--namespace", bcfg.Namespace)
	require.Equal(t, cli.ExitFindings, code)
	var unpublished []view.Finding
	for _, f := range d.Findings {
		if f.Check == "unpublished" {
			unpublished = append(unpublished, f)
		}
	}
	require.Len(t, unpublished, 2, "%+v", unpublished)
	require.Equal(t, "shop", unpublished[0].SagaType)
	require.Equal(t, int64(1), unpublished[0].Count)
	require.Contains(t, unpublished[0].Problem, "1 shop sagas wait past their deadline")
	require.Equal(t, chargeCmd.Name(), unpublished[1].RoutingKey)
	require.Contains(t, unpublished[1].Problem, `1 command messages "payment.charge" wait in the outbox, the oldest for 10m`)
	_, err := db.Pool.Exec(ctx, `DELETE FROM `+pgx.Identifier{schema}.Sanitize()+`.sagabox_saga WHERE id = $1`, rec.ID)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `DELETE FROM `+pgx.Identifier{schema}.Sanitize()+`.sagabox_outbox`)
	require.NoError(t, err)

	// Payment and mail deployed: nothing to fix.
	require.NoError(t, broker.Declare(ctx, transport.QueueSpec{Name: "payment", Commands: []string{chargeCmd.Name(), refundCmd.Name()}}))
	require.NoError(t, broker.Declare(ctx, transport.QueueSpec{Name: "mail", Commands: []string{notifyCmd.Name()}}))
	code, d = doctor(t, brokerArgs...)
	require.Equal(t, cli.ExitOK, code, "%+v", d.Findings)
	require.Empty(t, d.Findings)
	r = run(t, append([]string{"doctor"}, brokerArgs...)...)
	require.Equal(t, cli.ExitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "nothing to fix")
}

// The doctor reports a schema without sagabox tables, or not migrated to
// the end, with the command that fixes it; and a broker it cannot reach.
func TestDoctorSchemaAndBroker(t *testing.T) {
	t.Parallel()
	code, d := doctor(t, "--schema", "no_such_schema_"+uuid.NewString()[:8], "--amqp-url", "amqp://guest:guest@127.0.0.1:1/")
	require.Equal(t, cli.ExitFindings, code)
	require.Equal(t, "schema", d.Findings[0].Check)
	require.Contains(t, d.Findings[0].Problem, "has no sagabox tables")
	require.Contains(t, d.Findings[0].Fix, "sagabox migrate up --schema no_such_schema_")

	db := dbtest.Store(t)
	recordless := []string{"--schema", db.Store.Schema(), "--amqp-url", "amqp://guest:guest@127.0.0.1:1/", "--queue", "orders"}
	code, d = doctor(t, recordless...)
	require.Equal(t, cli.ExitFindings, code)
	require.Len(t, d.Findings, 1, "%+v", d.Findings)
	require.Equal(t, "dead-letters", d.Findings[0].Check)
	require.Contains(t, d.Findings[0].Problem, "cannot read the dead-letter queues")
}
