package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/cmd/sagabox/internal/cli"
	"github.com/sagabox/sagabox/cmd/sagabox/internal/view"
	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/transport"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

func runBroker(t *testing.T, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	code := cli.Run(ctx, args, &out, &errOut)
	return result{code, out.String(), errOut.String()}
}

// A dead-lettered message is listed, shown with its reason, and replayed
// back to its queue with the replay's audit headers; teardown deletes the
// namespace, after a dry run that deletes nothing.
func TestDeadLetterReplayAndTeardown(t *testing.T) {
	t.Parallel()
	cfg := amqptest.Config(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b, err := rabbitmq.New(ctx, cfg)
	require.NoError(t, err)
	require.NoError(t, b.Declare(ctx, transport.QueueSpec{Name: "inventory", Commands: []string{"inventory.reserve"}}))
	require.NoError(t, b.Close())
	flags := []string{"--amqp-url", cfg.URL, "--namespace", cfg.Namespace, "--queue", "inventory"}
	t.Cleanup(func() { runBroker(t, append([]string{"namespace", "teardown", "--yes"}, flags...)...) })

	amqptest.PublishRaw(t, "", b.DeadLetterQueueName("inventory"), amqp.Publishing{
		MessageId: "m-1", Type: "inventory.reserve", Body: []byte(`{"sku":"a"}`), DeliveryMode: amqp.Persistent,
		Headers: amqp.Table{rabbitmq.HeaderDeadLetterReason: "handler failed 5 times", rabbitmq.HeaderDeadLetterAt: time.Now().UTC().Format(time.RFC3339Nano)},
	})

	var list view.DeadLetterQueueList
	require.Eventually(t, func() bool {
		r := runBroker(t, append([]string{"--json", "dlq", "list"}, flags...)...)
		return r.code == cli.ExitOK && json.Unmarshal([]byte(r.stdout), &list) == nil && len(list.Queues) == 1 && list.Queues[0].Messages == 1
	}, 30*time.Second, 100*time.Millisecond)
	require.Equal(t, b.QueueName("inventory"), list.Queues[0].Source)

	r := runBroker(t, append([]string{"--json", "dlq", "show"}, flags...)...)
	require.Equal(t, cli.ExitOK, r.code, r.stderr)
	var shown view.DeadLetterList
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &shown))
	require.Len(t, shown.Messages, 1)
	require.Equal(t, "handler failed 5 times", shown.Messages[0].Reason)
	require.JSONEq(t, `{"sku":"a"}`, string(shown.Messages[0].Payload))
	require.Equal(t, 1, amqptest.QueueLength(t, b.DeadLetterQueueName("inventory")), "show leaves the messages in the queue")

	r = runBroker(t, append([]string{"dlq", "replay", "--reason", ""}, flags...)...)
	require.Equal(t, cli.ExitUsage, r.code, "a replay needs a reason: %s", r.stderr)
	r = runBroker(t, append([]string{"--json", "dlq", "replay", "--reason", "stock fixed", "--actor", "alice"}, flags...)...)
	require.Equal(t, cli.ExitOK, r.code, r.stderr)
	require.Contains(t, r.stderr, "dead letter replayed", "each replay is logged")
	var replayed view.DeadLetterReplay
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &replayed))
	require.Equal(t, 1, replayed.Replayed)
	require.Equal(t, 0, amqptest.QueueLength(t, b.DeadLetterQueueName("inventory")))
	d := amqptest.Next(t, amqptest.Consume(t, b.QueueName("inventory")), 30*time.Second)
	require.Equal(t, "m-1", d.MessageId)
	require.Equal(t, "alice", d.Headers[rabbitmq.HeaderReplayedBy])
	require.Equal(t, "stock fixed", d.Headers[rabbitmq.HeaderReplayedReason])
	require.NotContains(t, d.Headers, rabbitmq.HeaderDeadLetterReason)

	var top view.Teardown
	r = runBroker(t, append([]string{"--json", "namespace", "teardown"}, flags...)...)
	require.Equal(t, cli.ExitOK, r.code, r.stderr)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &top))
	require.True(t, top.DryRun)
	require.Len(t, top.Queues, 2+len(rabbitmq.RetryDelays()), "the queue, its dead-letter queue and its retry queues")
	require.Len(t, top.Exchanges, 4)
	r = runBroker(t, append([]string{"namespace", "teardown", "--yes"}, flags...)...)
	require.Equal(t, cli.ExitOK, r.code, r.stderr)
	r = runBroker(t, append([]string{"--json", "namespace", "teardown"}, flags...)...)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &top))
	require.Empty(t, top.Queues)
	require.Empty(t, top.Exchanges)
}
