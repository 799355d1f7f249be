package faulttest_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sagabox/sagabox/faulttest"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/participant"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/transport"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

// The service under test: a one-step saga that debits a wallet.
type debit struct {
	Wallet string `json:"wallet"`
	Cents  int64  `json:"cents"`
}

var debitCmd = saga.NewCommand[debit, saga.None]("wallet.debit")

var payout = saga.MustNew("payout", 1, saga.Step("debit", saga.Invoke(debitCmd,
	func(d *debit) debit { return *d }, func(*debit, saga.None) {})))

func handleDebit(ctx context.Context, tx pgx.Tx, req *participant.Request[debit]) (saga.None, error) {
	tag, err := tx.Exec(ctx, `UPDATE wallet.wallet SET cents = cents - $2 WHERE id = $1 AND cents >= $2`, req.Data.Wallet, req.Data.Cents)
	if err != nil {
		return saga.None{}, err
	}
	if tag.RowsAffected() == 0 {
		return saga.None{}, participant.Reject(errors.New("insufficient funds"))
	}
	return saga.None{}, nil
}

// A service's fault test: its real saga and handler, on the real database
// and broker, under the kit's default faults; afterwards every payout ended
// as planned and the wallet lost exactly the completed payouts.
func ExampleRun() {
	var t *testing.T       // the test's
	var pool *pgxpool.Pool // the test's database
	faulttest.Run(t, faulttest.Scenario[debit]{
		Pool:    pool,
		Migrate: true,
		Dial: func(ctx context.Context, name string) (transport.Broker, error) {
			return rabbitmq.New(ctx, rabbitmq.Config{Namespace: "payout-test", ConnectionName: name})
		},
		Orchestrator: faulttest.Orchestrator{Config: orchestrator.Config{
			Schema: "payouts", Service: "payouts", Definitions: []saga.Runner{payout},
		}},
		Participants: []faulttest.Participant{{
			Config:   participant.Config{Schema: "wallet", Service: "wallet"},
			Register: func(c *participant.Client) { participant.HandleCommand(c, debitCmd, handleDebit) },
		}},
		Sagas: 50,
		Input: func(rng *rand.Rand, i int) debit { return debit{Wallet: "w1", Cents: int64(1 + rng.IntN(100))} },
		Setup: func(ctx context.Context, pool *pgxpool.Pool, in []debit) error {
			_, err := pool.Exec(ctx, `CREATE TABLE wallet.wallet (id text PRIMARY KEY, cents bigint NOT NULL);
				INSERT INTO wallet.wallet VALUES ('w1', 5000)`)
			return err
		},
		Start: func(ctx context.Context, c *orchestrator.Client, in debit) (uuid.UUID, error) {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return uuid.Nil, err
			}
			defer tx.Rollback(ctx)
			started, err := orchestrator.Start(ctx, c, tx, payout, in, nil)
			if err != nil {
				return uuid.Nil, err
			}
			return started.ID, tx.Commit(ctx)
		},
		// Whether a payout can complete depends on the ones before it: a
		// real plan computes it from the inputs (see the checkout example);
		// here every payout fits.
		Plan: func(debit) saga.Status { return saga.StatusCompleted },
		Invariants: []faulttest.Invariant[debit]{{
			Name: "the wallet lost exactly the completed payouts",
			Check: func(ctx context.Context, pool *pgxpool.Pool, rs []faulttest.Result[debit]) error {
				var left, paid int64
				if err := pool.QueryRow(ctx, `SELECT cents FROM wallet.wallet WHERE id = 'w1'`).Scan(&left); err != nil {
					return err
				}
				for _, r := range rs {
					if r.Status == saga.StatusCompleted {
						paid += r.Input.Cents
					}
				}
				if 5000-left != paid {
					return errors.New("the wallet does not add up")
				}
				return nil
			},
		}},
	})
}
