package participant_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/participant"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store/driver"
	"github.com/sagabox/sagabox/transport"
)

// The contracts of the outside-call tests: a payment charged at, and
// refunded by, an outside provider.
type ChargeReq struct {
	Account string `json:"account"`
	Cents   int    `json:"cents"`
}

type ChargeReply struct {
	ChargeID string `json:"charge_id"`
}

type RefundReq struct {
	Account string `json:"account"`
}

var (
	Charge = saga.NewCommand[ChargeReq, ChargeReply]("payment.charge")
	Refund = saga.NewCommand[RefundReq, saga.None]("payment.refund")
)

// provider is an outside payment provider: an HTTP server that counts the
// calls it gets per idempotency key and applies each key once (a call with
// a key it applied before answers as the first did).
type provider struct {
	srv *httptest.Server

	mu      sync.Mutex
	calls   map[string]int    // calls per key
	resumed map[string][]bool // the Resumed flag of each call, per key
	applied map[string]string // key → charge id, for keys applied
	// fail, when set, answers the n-th call (from 1) of a key with a status
	// instead of applying it (0: apply).
	fail func(key string, n int) int
	// hold, when set, makes the first call of a key wait until it is closed.
	hold    chan struct{}
	arrived chan string
}

func newProvider(t *testing.T) *provider {
	t.Helper()
	p := &provider{calls: map[string]int{}, resumed: map[string][]bool{}, applied: map[string]string{}, arrived: make(chan string, 16)}
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *provider) serve(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	p.mu.Lock()
	p.calls[key]++
	n := p.calls[key]
	p.resumed[key] = append(p.resumed[key], r.Header.Get("X-Resumed") == "true")
	fail, hold := p.fail, p.hold
	p.mu.Unlock()
	select {
	case p.arrived <- key:
	default:
	}
	if hold != nil && n == 1 {
		<-hold
	}
	if fail != nil {
		if status := fail(key, n); status != 0 {
			http.Error(w, "provider says no", status)
			return
		}
	}
	p.mu.Lock()
	id, ok := p.applied[key]
	if !ok {
		id = fmt.Sprintf("%s-%d", r.URL.Path[1:], len(p.applied)+1)
		p.applied[key] = id
	}
	p.mu.Unlock()
	_ = json.NewEncoder(w).Encode(ChargeReply{ChargeID: id})
}

func (p *provider) callsOf(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls[key]
}

func (p *provider) resumedOf(key string) []bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]bool(nil), p.resumed[key]...)
}

func (p *provider) effects(prefix string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, id := range p.applied {
		if strings.HasPrefix(id, prefix) {
			n++
		}
	}
	return n
}

// post calls the provider at path with the request's idempotency key:
// 402 is a business "no", any other failure transient.
func (p *provider) post(ctx context.Context, path, key string, resumed bool) (ChargeReply, error) {
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, p.srv.URL+path, nil)
	if err != nil {
		return ChargeReply{}, err
	}
	r.Header.Set("Idempotency-Key", key)
	r.Header.Set("X-Resumed", fmt.Sprint(resumed))
	resp, err := p.srv.Client().Do(r)
	if err != nil {
		return ChargeReply{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	switch {
	case resp.StatusCode == http.StatusPaymentRequired:
		return ChargeReply{}, participant.RejectWithCode("declined", errors.New("the provider declined the charge"))
	case resp.StatusCode != http.StatusOK:
		return ChargeReply{}, fmt.Errorf("provider: %s", resp.Status)
	}
	var reply ChargeReply
	return reply, json.NewDecoder(resp.Body).Decode(&reply)
}

// payments registers the outside handlers on c: the charge and the refund
// at p, each recorded in the ledger table.
func payments(e *env, p *provider) func(*participant.Client) {
	_, err := e.store.Pool.Exec(context.Background(), "CREATE TABLE IF NOT EXISTS "+e.table("ledger")+" (key text PRIMARY KEY, what text NOT NULL)")
	require.NoError(e.t, err)
	return func(c *participant.Client) {
		participant.HandleOutsideCommand(c, Charge,
			func(ctx context.Context, req *participant.OutsideRequest[ChargeReq]) (ChargeReply, error) {
				return p.post(ctx, "/charge", req.IdempotencyKey, req.Resumed)
			},
			func(ctx context.Context, tx pgx.Tx, req *participant.OutsideRequest[ChargeReq], reply ChargeReply) error {
				_, err := tx.Exec(ctx, "INSERT INTO "+e.table("ledger")+" (key, what) VALUES ($1, $2)", req.IdempotencyKey, reply.ChargeID)
				return err
			})
		participant.HandleOutsideCompensation(c, Refund,
			func(ctx context.Context, req *participant.OutsideRequest[RefundReq]) error {
				_, err := p.post(ctx, "/refund", req.IdempotencyKey, req.Resumed)
				return err
			},
			func(ctx context.Context, tx pgx.Tx, req *participant.OutsideRequest[RefundReq]) error {
				_, err := tx.Exec(ctx, "INSERT INTO "+e.table("ledger")+" (key, what) VALUES ($1, 'refund')", req.IdempotencyKey)
				return err
			})
	}
}

func charge(sagaID uuid.UUID) message.Message {
	return newMessage(sagaID, "charge", message.KindCommand, Charge.Name(), ChargeReq{Account: "alice", Cents: 500})
}

func refund(sagaID uuid.UUID) message.Message {
	return newMessage(sagaID, "charge", message.KindCompensation, Refund.Name(), RefundReq{Account: "alice"})
}

func actionKey(id uuid.UUID) string {
	return participant.IdempotencyKey(id, 0, "charge", message.PhaseAction)
}

func compensationKey(id uuid.UUID) string {
	return participant.IdempotencyKey(id, 0, "charge", message.PhaseCompensation)
}

func (e *env) ledger(key string) int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.store.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+e.table("ledger")+" WHERE key = $1", key).Scan(&n))
	return n
}

func (e *env) inboxState(id uuid.UUID) (state string, attempt int) {
	e.t.Helper()
	require.NoError(e.t, e.store.Pool.QueryRow(context.Background(), "SELECT state, attempt FROM "+e.table("sagabox_inbox")+" WHERE message_id = $1", id).Scan(&state, &attempt))
	return state, attempt
}

// A duplicate of a message whose outside call was recorded is acknowledged
// without calling anything; a re-send of the step (a new message id) is
// answered with the first reply, without a call either.
func TestGuaranteeNoDoubleEffectOutsideCallDuplicate(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := newProvider(t)
	e.newClient(nil, payments(e, p))

	id := uuid.New()
	cmd := charge(id)
	e.publish(cmd)
	requireSuccess(t, e.replies.wait(t, cmd.MessageID))
	state, _ := e.inboxState(cmd.MessageID)
	require.Equal(t, "done", state)

	e.publish(cmd)
	testkit.WaitFor(t, waitFor, "the duplicate counted", func() bool { return e.duplicates(cmd.MessageID) == 1 })
	again := resend(cmd)
	e.publish(again)
	reply := e.replies.wait(t, again.MessageID)
	requireSuccess(t, reply)
	require.JSONEq(t, string(e.replies.wait(t, cmd.MessageID).Payload), string(reply.Payload), "the re-send gets the first reply")

	require.Equal(t, 1, p.callsOf(actionKey(id)), "one call for the step")
	require.Equal(t, 1, e.ledger(actionKey(id)), "recorded once")
	require.Equal(t, 1, e.outboxReplies(cmd.MessageID))
}

// A participant that dies after the outside call and before the commit that
// records it leaves the inbox entry "started"; the redelivery, at a new
// client, calls again with the same idempotency key and Resumed set, and
// the step ends with one effective charge, recorded and answered once.
func TestGuaranteeNoDoubleEffectOutsideCallResumedAfterCrash(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := newProvider(t)

	// The first client dies right after its call: the hook ends the
	// delivery before the second commit and stops the client, hard.
	bA := e.newBroker()
	cfgA := e.config(bA)
	cfgA.Workers = 1
	a, err := participant.NewClient(cfgA)
	require.NoError(t, err)
	payments(e, p)(a)
	killed := make(chan struct{})
	var once sync.Once
	participant.SetTestHookAfterCall(a, func(*transport.Delivery) error {
		once.Do(func() { close(killed) })
		return errors.New("killed after the outside call")
	})
	stopA := e.start(a, bA)

	id := uuid.New()
	cmd := charge(id)
	e.publish(cmd)
	select {
	case <-killed:
	case <-time.After(waitFor):
		t.Fatal("the first client never made the call")
	}
	require.NoError(t, stopA())
	require.NoError(t, bA.Close())
	state, _ := e.inboxState(cmd.MessageID)
	require.Equal(t, "started", state, "the entry committed before the call stays started")
	require.Equal(t, map[message.Phase]driver.BarrierOutcome{message.PhaseAction: driver.BarrierStarted}, e.barrier(id))
	require.Equal(t, 0, e.replies.count(cmd.MessageID), "nothing answered yet")

	e.newClient(nil, payments(e, p))
	requireSuccess(t, e.replies.wait(t, cmd.MessageID))

	key := actionKey(id)
	resumed := p.resumedOf(key)
	require.GreaterOrEqual(t, len(resumed), 2, "the call was made again")
	require.False(t, resumed[0], "the first call is not resumed")
	require.True(t, resumed[len(resumed)-1], "the call after the crash is resumed")
	require.Equal(t, 1, p.effects("charge"), "one effective charge")
	require.Equal(t, 1, e.ledger(key), "recorded once")
	require.Equal(t, 1, e.outboxReplies(cmd.MessageID), "answered once")
	state, attempt := e.inboxState(cmd.MessageID)
	require.Equal(t, "done", state)
	require.Equal(t, len(resumed), attempt, "every call counted in the entry")
	require.Equal(t, 0, e.duplicates(cmd.MessageID), "a resumed delivery is no duplicate")
	require.Equal(t, map[message.Phase]driver.BarrierOutcome{message.PhaseAction: driver.BarrierApplied}, e.barrier(id))
}

// A failing outside call is retried with backoff, with the same key, until
// it succeeds; one that keeps failing is dead-lettered after the configured
// attempts (and answered with a failure); a provider's "no" is a rejection,
// answered at once.
func TestOutsideCallRetriedRejectedDeadLettered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := newProvider(t)
	flaky, broken, declined := uuid.New(), uuid.New(), uuid.New()
	p.fail = func(key string, n int) int {
		switch key {
		case actionKey(flaky):
			if n <= 2 {
				return http.StatusServiceUnavailable
			}
		case actionKey(broken):
			return http.StatusInternalServerError
		case actionKey(declined):
			return http.StatusPaymentRequired
		}
		return 0
	}
	e.newClient(nil, payments(e, p)) // MaxAttempts 3
	msgs := map[uuid.UUID]message.Message{flaky: charge(flaky), broken: charge(broken), declined: charge(declined)}
	for _, m := range msgs {
		e.publish(m)
	}

	requireSuccess(t, e.replies.wait(t, msgs[flaky].MessageID))
	require.Equal(t, 3, p.callsOf(actionKey(flaky)), "two failures, then the call that succeeds")
	require.Equal(t, []bool{false, true, true}, p.resumedOf(actionKey(flaky)))
	require.Equal(t, 1, e.ledger(actionKey(flaky)))

	requireFailure(t, e.replies.wait(t, msgs[broken].MessageID), saga.CodeDeadLettered)
	require.Equal(t, 3, p.callsOf(actionKey(broken)), "MaxAttempts calls")
	testkit.WaitFor(t, waitFor, "the broken charge dead-lettered", func() bool { return amqptest.QueueLength(t, e.broker.DeadLetterQueueName(service)) == 1 })
	state, _ := e.inboxState(msgs[broken].MessageID)
	require.Equal(t, "done", state)
	require.Equal(t, driver.BarrierRejected, e.barrier(broken)[message.PhaseAction])
	require.Equal(t, 0, e.ledger(actionKey(broken)))

	requireFailure(t, e.replies.wait(t, msgs[declined].MessageID), "declined")
	require.Equal(t, 1, p.callsOf(actionKey(declined)), "a rejection is not retried")
	require.Equal(t, driver.BarrierRejected, e.barrier(declined)[message.PhaseAction])
	require.Equal(t, 0, e.ledger(actionKey(declined)), "a rejection records nothing")
	for _, m := range msgs {
		require.Equal(t, 1, e.outboxReplies(m.MessageID))
	}
}

// A compensation that arrives while its action's outside call is in flight
// waits for it (it is retried until the action is recorded), then refunds,
// exactly once, with its own key. A late action after a compensation is not
// called at all.
func TestGuaranteeCompensationRaceOutsideCall(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := newProvider(t)
	p.hold = make(chan struct{})
	var release sync.Once
	t.Cleanup(func() { release.Do(func() { close(p.hold) }) })
	e.newClient(func(cfg *participant.Config) {
		cfg.Retry = saga.RetryPolicy{InitialInterval: 5 * time.Millisecond, MaximumInterval: 50 * time.Millisecond, MaxAttempts: 1000}
		// One message per worker: the compensation must not wait behind
		// the held charge in the same consumer's prefetch.
		cfg.Workers, cfg.Prefetch = 2, 2
	}, payments(e, p))

	id := uuid.New()
	cmd, comp := charge(id), refund(id)
	e.publish(cmd)
	select {
	case key := <-p.arrived:
		require.Equal(t, actionKey(id), key)
	case <-time.After(waitFor):
		t.Fatal("the charge never reached the provider")
	}
	e.publish(comp)
	testkit.WaitFor(t, waitFor, "the compensation to wait for the action", func() bool {
		a, err := e.store.AttemptGet(context.Background(), comp.MessageID)
		return err == nil && a.Attempts >= 2
	})
	require.Equal(t, 0, p.callsOf(compensationKey(id)), "no refund before the charge is recorded")
	release.Do(func() { close(p.hold) })

	requireSuccess(t, e.replies.wait(t, cmd.MessageID))
	requireSuccess(t, e.replies.wait(t, comp.MessageID))
	require.Equal(t, 1, p.callsOf(actionKey(id)))
	require.Equal(t, 1, p.callsOf(compensationKey(id)), "refunded exactly once")
	require.Equal(t, 1, p.effects("refund"))
	require.Equal(t, 1, e.ledger(compensationKey(id)))
	require.Equal(t, map[message.Phase]driver.BarrierOutcome{
		message.PhaseAction: driver.BarrierApplied, message.PhaseCompensation: driver.BarrierApplied,
	}, e.barrier(id))

	// The compensation first, then its action: nothing is called.
	late := uuid.New()
	lateComp, lateCmd := refund(late), charge(late)
	e.publish(lateComp)
	requireSuccess(t, e.replies.wait(t, lateComp.MessageID))
	e.publish(lateCmd)
	requireFailure(t, e.replies.wait(t, lateCmd.MessageID), saga.CodeCompensatedBeforeRun)
	require.Equal(t, 0, p.callsOf(actionKey(late)), "the late action is not called")
	require.Equal(t, 0, p.callsOf(compensationKey(late)), "nothing to undo")
	state, _ := e.inboxState(lateCmd.MessageID)
	require.Equal(t, "done", state)
}

// TestOutsideCallCostsTwoCommits counts, through a pgx tracer, what the
// outside form costs per delivery against an ordinary handler: two
// transactions (commits) instead of one, and four engine round trips
// instead of two (BEGIN with the inbox record and barrier mark; COMMIT
// before the call; BEGIN with the claim of the started entry and the
// handler's savepoint; the reply and the mark's outcome with COMMIT), plus
// the handler's own statements (the ordinary handler here makes one, the
// outside one none).
func TestOutsideCallCostsTwoCommits(t *testing.T) {
	t.Parallel()
	var rts dbtest.RoundTrips
	pool := dbtest.PoolWith(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = &rts })
	e := newEnvOnPool(t, pool)
	e.setStock("a", 10)
	p := newProvider(t)
	e.newClient(func(cfg *participant.Config) { cfg.Workers = 1 }, func(c *participant.Client) {
		inventory(e, c)
		participant.HandleOutsideCommand(c, Charge, func(ctx context.Context, req *participant.OutsideRequest[ChargeReq]) (ChargeReply, error) {
			return p.post(ctx, "/charge", req.IdempotencyKey, req.Resumed)
		}, nil)
	})

	measure := func(m message.Message) []dbtest.Transaction {
		rts.Start()
		e.publish(m)
		requireSuccess(t, e.replies.wait(t, m.MessageID))
		rts.Stop()
		var txs []dbtest.Transaction
		for _, tx := range rts.Transactions() {
			if tx.Has("DeliveryBeginAction") || tx.Has("DeliveryResume") {
				txs = append(txs, tx)
			}
		}
		return txs
	}
	ordinary := measure(reserve(uuid.New(), "a", 1))
	outside := measure(charge(uuid.New()))
	count := func(txs []dbtest.Transaction) (n int) {
		for _, tx := range txs {
			n += len(tx.RoundTrips)
		}
		return n
	}
	t.Logf("ordinary handler: %d transaction(s), %d round trips; outside handler: %d transactions, %d round trips",
		len(ordinary), count(ordinary), len(outside), count(outside))
	require.Len(t, ordinary, 1)
	require.Equal(t, 3, count(ordinary), "BEGIN with the inbox record and mark, the handler's UPDATE, COMMIT with the reply")
	require.Len(t, outside, 2, "one commit before the call, one after")
	for _, tx := range outside {
		require.Len(t, tx.RoundTrips, 2, "BEGIN with the first statement, COMMIT with (or after) the last")
	}
}

// Two copies of one message in flight at once (both begin while the entry is
// "started"): both call with the same key, the first to record wins, and the
// other is found out as a duplicate when it comes to record, and counted as
// one: the inbox's duplicate count stays true to what was delivered.
func TestOutsideCallConcurrentCopyCountsAsDuplicate(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := newProvider(t)
	p.hold = make(chan struct{})
	var release sync.Once
	t.Cleanup(func() { release.Do(func() { close(p.hold) }) })
	e.newClient(func(cfg *participant.Config) { cfg.Workers, cfg.Prefetch = 2, 2 }, payments(e, p))

	id := uuid.New()
	cmd := charge(id)
	e.publish(cmd)
	select {
	case <-p.arrived:
	case <-time.After(waitFor):
		t.Fatal("the charge never reached the provider")
	}
	e.publish(cmd) // the same message again, while the first call is held
	testkit.WaitFor(t, waitFor, "the copy to call too", func() bool { return p.callsOf(actionKey(id)) == 2 })
	requireSuccess(t, e.replies.wait(t, cmd.MessageID))
	release.Do(func() { close(p.hold) })

	testkit.WaitFor(t, waitFor, "the held copy counted as a duplicate", func() bool { return e.duplicates(cmd.MessageID) == 1 })
	require.Equal(t, 1, p.effects("charge"), "charged once")
	require.Equal(t, 1, e.ledger(actionKey(id)), "recorded once")
	state, _ := e.inboxState(cmd.MessageID)
	require.Equal(t, "done", state)
}
