package faulttest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/transport"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

// blockingRunner runs until its context ends, or returns at once when
// quits is set, as a client that stops by itself does.
type blockingRunner struct {
	quits bool
	ran   chan struct{}
}

func (b *blockingRunner) Run(ctx context.Context) error {
	close(b.ran)
	if b.quits {
		return nil
	}
	<-ctx.Done()
	return nil
}

func testNode(t *testing.T, life context.Context, runners chan *blockingRunner) *node {
	t.Helper()
	return &node{name: "test client", life: life, build: func(context.Context) (runner, transport.Broker, error) {
		r := <-runners
		return r, amqptest.NewBroker(t, rabbitmq.Config{}), nil
	}}
}

// A client started again by a fault runs until the run ends: it must not
// die with the fault schedule (which ends before the outboxes drain), and
// a kill is not a failure.
func TestRestartedClientLivesAsLongAsTheRun(t *testing.T) {
	t.Parallel()
	life, endRun := context.WithCancel(context.Background())
	defer endRun()
	runners := make(chan *blockingRunner, 2)
	first, second := &blockingRunner{ran: make(chan struct{})}, &blockingRunner{ran: make(chan struct{})}
	runners <- first
	runners <- second
	n := testNode(t, life, runners)
	require.NoError(t, n.start())
	<-first.ran
	require.NoError(t, n.restart())
	<-second.ran

	n.mu.Lock()
	done := n.done
	n.mu.Unlock()
	select {
	case <-done:
		t.Fatal("the restarted client stopped while the run goes on")
	case <-time.After(50 * time.Millisecond):
	}
	require.NoError(t, n.failure(), "a killed client is not a failure")
	n.stop()
	require.NoError(t, n.failure(), "a stopped client is not a failure")
}

// A client whose Run returns by itself, even without an error, is reported:
// its queue and outbox would go unserved, and the run would end in a stall
// that names no cause.
func TestClientThatStopsByItselfIsAFailure(t *testing.T) {
	t.Parallel()
	runners := make(chan *blockingRunner, 1)
	quitter := &blockingRunner{quits: true, ran: make(chan struct{})}
	runners <- quitter
	n := testNode(t, context.Background(), runners)
	require.NoError(t, n.start())
	n.mu.Lock()
	done := n.done
	n.mu.Unlock()
	<-done
	require.ErrorContains(t, n.failure(), "test client stopped: returned without being stopped")
	n.stop()
}
