package orchestrator_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/participant"
	"github.com/sagabox/sagabox/saga"
)

// A saga whose charge calls an outside provider (HandleOutsideCommand)
// completes across a payment participant that is stopped hard after the
// call and before the commit that records it: the new participant calls
// again with the same idempotency key, the provider applies it once, and
// the saga completes with one charge.
func TestGuaranteeNoDoubleEffectOutsideCallSagaCompletesAcrossACrash(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var mu sync.Mutex
	calls := map[string]int{}
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls[r.Header.Get("Idempotency-Key")]++
		mu.Unlock()
		_, _ = w.Write([]byte(`{"charge_id":"ch-1"}`))
	}))
	t.Cleanup(provider.Close)

	crashed := make(chan struct{})
	var once sync.Once
	payment := func(crash bool) *participant.Client {
		cfg := e.participantConfig(e.pay, "payment")
		cfg.StopTimeout = 500 * time.Millisecond
		c, err := participant.NewClient(cfg)
		require.NoError(t, err)
		participant.HandleOutsideCommand(c, Charge,
			func(ctx context.Context, req *participant.OutsideRequest[ChargeReq]) (ChargeReply, error) {
				r, err := http.NewRequestWithContext(ctx, http.MethodPost, provider.URL, nil)
				if err != nil {
					return ChargeReply{}, err
				}
				r.Header.Set("Idempotency-Key", req.IdempotencyKey)
				resp, err := provider.Client().Do(r)
				if err != nil {
					return ChargeReply{}, err
				}
				_ = resp.Body.Close()
				return ChargeReply{ChargeID: "ch-1"}, nil
			},
			func(ctx context.Context, tx pgx.Tx, req *participant.OutsideRequest[ChargeReq], reply ChargeReply) error {
				if crash {
					// The process "dies" here: after the call, before the
					// second commit. The delivery hangs until the client is
					// stopped past its stop timeout.
					once.Do(func() { close(crashed) })
					<-ctx.Done()
					return ctx.Err()
				}
				_, err := tx.Exec(ctx, "INSERT INTO "+pgx.Identifier{e.pay.Schema(), "charges"}.Sanitize()+" (order_id, amount) VALUES ($1, $2)",
					req.Data.OrderID, req.Data.Amount)
				return err
			})
		participant.HandleCompensation(c, Refund, func(context.Context, pgx.Tx, *participant.Request[OrderRef]) error {
			return errors.New("not expected: the saga completes")
		})
		return c
	}

	def := orderSaga(1, time.Minute, 1)
	c := e.runOrchestrator(e.orchConfig(def))
	testkit.Run(t, e.inventory(true).Run)
	ctxA, stopA := context.WithCancel(context.Background())
	doneA := make(chan error, 1)
	a := payment(true)
	go func() { doneA <- a.Run(ctxA) }()

	st := e.start(c, def, Order{ID: "o-outside", Qty: 1, Amount: 10, Address: "here"}, nil)
	select {
	case <-crashed:
	case <-time.After(60 * time.Second):
		t.Fatal("the charge never reached the provider")
	}
	stopA()
	require.NoError(t, <-doneA)

	testkit.Run(t, payment(false).Run)
	waitStatus(t, c, st.ID, saga.StatusCompleted, 60*time.Second)

	key := participant.IdempotencyKey(st.ID, 0, "charge", message.PhaseAction)
	mu.Lock()
	n := calls[key]
	mu.Unlock()
	require.Equal(t, 2, n, "the call made again after the crash, with the same key")
	var charges int
	require.NoError(t, e.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+pgx.Identifier{e.pay.Schema(), "charges"}.Sanitize()).Scan(&charges))
	require.Equal(t, 1, charges, "one charge recorded")
}
