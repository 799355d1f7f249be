//go:build fault

package participant_test

import (
	"context"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/participant"
	"github.com/sagabox/sagabox/saga"
)

// restartPostgres restarts the PostgreSQL cluster of the test database.
func restartPostgres(t *testing.T) {
	t.Helper()
	out, err := exec.Command("sh", "-c", "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main restart").CombinedOutput()
	require.NoError(t, err, "restart PostgreSQL: %s", out)
}

// A participant consuming a stream of commands across a RabbitMQ restart
// and a PostgreSQL restart resumes on its own: every command is applied
// exactly once and answered exactly once, nothing is dead-lettered.
func TestGuaranteeNoLostMessageParticipantSurvivesRestarts(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.setStock("stream", 1000)
	e.newClient(func(cfg *participant.Config) {
		cfg.Retry = saga.RetryPolicy{InitialInterval: 10 * time.Millisecond, MaximumInterval: 300 * time.Millisecond, MaxAttempts: 20}
	}, nil)

	const n = 60
	msgs := make([]message.Message, n)
	for i := range msgs {
		msgs[i] = reserve(uuid.New(), "stream", 1)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() {
		// Publish at a steady pace, re-publishing (same message id) whatever
		// the broker did not confirm.
		tick := time.NewTicker(25 * time.Millisecond)
		defer tick.Stop()
		for _, m := range msgs {
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
				err := e.broker.Publish(pctx, m)
				pcancel()
				if err == nil {
					break
				}
			}
		}
	})
	answered := func() int {
		k := 0
		for _, m := range msgs {
			if e.replies.count(m.MessageID) > 0 {
				k++
			}
		}
		return k
	}

	testkit.WaitFor(t, waitFor, "first commands answered", func() bool { return answered() >= 10 })
	amqptest.RestartBroker(t)
	testkit.WaitFor(t, waitFor, "commands answered after the RabbitMQ restart", func() bool { return answered() >= 30 })
	restartPostgres(t)
	testkit.WaitFor(t, waitFor, "every command answered after the PostgreSQL restart", func() bool { return answered() == n })

	for _, m := range msgs {
		requireSuccess(t, e.replies.wait(t, m.MessageID))
	}
	// The pool may still hold connections that died with the restart.
	testkit.WaitFor(t, waitFor, "database reachable again", func() bool {
		var qty int
		err := e.store.Pool.QueryRow(context.Background(), "SELECT qty FROM "+e.table("stock")+" WHERE sku = 'stream'").Scan(&qty)
		return err == nil
	})
	require.Equal(t, 1000-n, e.stock("stream"), "every command applied exactly once")
	for _, m := range msgs {
		require.Equal(t, 1, e.outboxReplies(m.MessageID), "one reply to %s", m.MessageID)
	}
	stats, err := e.store.Store.InboxStats(context.Background(), 0)
	require.NoError(t, err)
	require.Equal(t, int64(n), stats.Total)
	require.Equal(t, 0, amqptest.QueueLength(t, e.broker.DeadLetterQueueName(service)), "nothing dead-lettered")
	dead, err := e.store.Store.Attempts(context.Background(), true, nil, 100)
	require.NoError(t, err)
	require.Empty(t, dead)
}
