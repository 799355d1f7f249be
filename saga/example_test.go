package saga_test

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/sagabox/sagabox/saga"
)

// Transfer is the data of the example saga.
type Transfer struct {
	From    string `json:"from"`
	To      string `json:"to"`
	Amount  int    `json:"amount"`
	DebitID string `json:"debit_id,omitempty"`
}

type DebitRequest struct {
	Account string `json:"account"`
	Amount  int    `json:"amount"`
}

type DebitReply struct {
	DebitID string `json:"debit_id"`
}

type CreditRequest struct {
	Account string `json:"account"`
	Amount  int    `json:"amount"`
}

type RefundRequest struct {
	DebitID string `json:"debit_id"`
}

// The command contracts, shared with the participants.
var (
	Debit       = saga.NewCommand[DebitRequest, DebitReply]("bank.debit")
	RefundDebit = saga.NewCommand[RefundRequest, saga.None]("bank.refund-debit")
	Credit      = saga.NewCommand[CreditRequest, saga.None]("bank.credit")
)

// TransferSaga debits one account and credits another; if the credit is
// rejected the debit is refunded.
var TransferSaga = saga.MustNew("transfer", 1,
	saga.Step("debit",
		saga.Invoke(Debit,
			func(t *Transfer) DebitRequest { return DebitRequest{Account: t.From, Amount: t.Amount} },
			func(t *Transfer, r DebitReply) { t.DebitID = r.DebitID }),
		saga.Compensate(RefundDebit, func(t *Transfer) RefundRequest { return RefundRequest{DebitID: t.DebitID} }),
		saga.WithTimeout[Transfer](30*time.Second),
		saga.WithRetry[Transfer](saga.RetryPolicy{MaxAttempts: 3}),
	),
	saga.Step("credit",
		saga.Invoke(Credit, func(t *Transfer) CreditRequest { return CreditRequest{Account: t.To, Amount: t.Amount} }, nil),
	),
)

// This example drives the pure core as the orchestrator does: start, then
// apply each reply to the stored instance and emit what it returns.
func Example() {
	ctx := context.Background()
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	show := func(res saga.Result) {
		for _, m := range res.Emit {
			fmt.Printf("emit %s %s %s\n", m.Phase, m.Type, m.Payload)
		}
		fmt.Println("status:", res.Instance.Status)
	}
	// reply answers the message the saga sent last.
	reply := func(inst saga.Instance, last saga.Outgoing, kind saga.EventKind, payload string) saga.Result {
		now = now.Add(time.Second)
		res, err := TransferSaga.Apply(ctx, inst, saga.Event{
			Kind: kind, Type: last.Type, Step: last.Step, StepIndex: last.StepIndex, Attempt: last.Attempt,
			Payload: json.RawMessage(payload), At: now,
		})
		if err != nil {
			panic(err)
		}
		return res
	}

	data, _ := TransferSaga.EncodeData(Transfer{From: "alice", To: "bob", Amount: 40})
	res, err := TransferSaga.Start(ctx, uuid.New(), data, now)
	if err != nil {
		panic(err)
	}
	show(res)
	res = reply(res.Instance, res.Emit[0], saga.EventReplySuccess, `{"debit_id":"d-1"}`)
	show(res)
	res = reply(res.Instance, res.Emit[0], saga.EventReplyFailure, `{"reason":"account closed"}`)
	show(res)
	res = reply(res.Instance, res.Emit[0], saga.EventReplySuccess, `{}`)
	show(res)
	fmt.Println("last error:", res.Instance.LastError)
	// Output:
	// emit action bank.debit {"account":"alice","amount":40}
	// status: running
	// emit action bank.credit {"account":"bob","amount":40}
	// status: running
	// emit compensation bank.refund-debit {"debit_id":"d-1"}
	// status: compensating
	// status: compensated
	// last error: account closed
}

// A retry policy's delays between attempts.
func ExampleRetryPolicy_Backoff() {
	p := saga.RetryPolicy{InitialInterval: time.Second, BackoffCoefficient: 2, MaximumInterval: 5 * time.Second}
	for attempt := 1; attempt <= 4; attempt++ {
		fmt.Println(attempt, p.Backoff(attempt))
	}
	// Output:
	// 1 1s
	// 2 2s
	// 3 4s
	// 4 5s
}

// A local step that rejects compensates the saga; its error is the reason.
func ExampleReject() {
	def := saga.MustNew("limits", 1,
		saga.LocalStep("check-limit", func(_ context.Context, t *Transfer) error {
			if t.Amount > 100 {
				return saga.Reject(fmt.Errorf("amount %d over the limit", t.Amount))
			}
			return nil
		}),
	)
	data, _ := def.EncodeData(Transfer{Amount: 500})
	res, _ := def.Start(context.Background(), uuid.New(), data, time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	fmt.Println(res.Instance.Status, "-", res.Instance.LastError)
	// Output: compensated - amount 500 over the limit
}
