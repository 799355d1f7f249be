//go:build fault

package relay

import (
	"os/exec"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

// The broker restarts while rows are written and published: rows stay in
// the outbox, the relay backs off and drains once the broker is back.
func TestGuaranteeNoLostMessageRelayAcrossBrokerRestart(t *testing.T) {
	s := dbtest.Store(t, store.LineMessaging)
	b := amqptest.NewBroker(t, rabbitmq.Config{})
	snk := newSink(t, b)
	r, _ := runRelay(t, testConfig{Store: s, Publisher: b, Options: Options{BatchSize: 20}})

	var ids []uuid.UUID
	for i := range 10 {
		ids = append(ids, writeCommitted(t, s, events("k", i*10, 10))...)
		r.Wake()
	}
	amqptest.RestartBroker(t)
	for i := 10; i < 20; i++ {
		ids = append(ids, writeCommitted(t, s, events("k", i*10, 10))...)
		r.Wake()
	}
	snk.waitDistinct(t, len(ids))
	waitBacklogZero(t, s)
	seen, order := snk.snapshot()
	for _, id := range ids {
		require.Contains(t, seen, id)
	}
	require.IsIncreasing(t, order["k"])
}

// PostgreSQL restarts under a running relay: it reconnects on its own and
// publishes what was committed before and after.
func TestGuaranteeNoLostMessageRelayAcrossDatabaseRestart(t *testing.T) {
	s := dbtest.Store(t, store.LineMessaging)
	b := amqptest.NewBroker(t, rabbitmq.Config{})
	snk := newSink(t, b)
	r, _ := runRelay(t, testConfig{Store: s, Publisher: b, Options: Options{BatchSize: 20, Listen: true}})

	ids := writeCommitted(t, s, events("k", 0, 50))
	r.Wake()
	out, err := exec.Command("bash", "-c", "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main restart").CombinedOutput()
	require.NoError(t, err, "restart postgres: %s", out)
	require.Eventually(t, func() bool {
		return exec.Command("pg_isready", "-q", "-h", "127.0.0.1").Run() == nil
	}, time.Minute, 100*time.Millisecond)
	// The pool may hand out a dead connection first; retry the write.
	require.Eventually(t, func() bool {
		more, err := tryWrite(s, events("k", 50, 50))
		if err != nil {
			return false
		}
		ids = append(ids, more...)
		return true
	}, time.Minute, 100*time.Millisecond)
	r.Wake()
	snk.waitDistinct(t, len(ids))
	waitBacklogZero(t, s)
	seen, order := snk.snapshot()
	for _, id := range ids {
		require.Contains(t, seen, id)
	}
	require.IsIncreasing(t, order["k"])
}
