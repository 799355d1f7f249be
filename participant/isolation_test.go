package participant_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/participant"
)

// A compensation handler that commits the transaction it is given (a bug)
// only releases its savepoint: the barrier mark and the reply are still
// written with its effect, in one transaction, and the compensation still
// runs once.
func TestGuaranteeNoDoubleEffectHandlerCannotEndTheDeliveryTransaction(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.setStock("isolated", 10)
	e.newClient(nil, func(c *participant.Client) {
		participant.HandleCommand(c, Reserve, func(ctx context.Context, tx pgx.Tx, req *participant.Request[ReserveReq]) (ReserveReply, error) {
			_, err := tx.Exec(ctx, "UPDATE "+e.table("stock")+" SET qty = qty - $2 WHERE sku = $1", req.Data.SKU, req.Data.Qty)
			return ReserveReply{}, err
		})
		participant.HandleCompensation(c, Release, func(ctx context.Context, tx pgx.Tx, req *participant.Request[ReleaseReq]) error {
			if _, err := tx.Exec(ctx, "UPDATE "+e.table("stock")+" SET qty = qty + $2 WHERE sku = $1", req.Data.SKU, req.Data.Qty); err != nil {
				return err
			}
			return tx.Commit(ctx) // wrong, but must not break the delivery's transaction
		})
	})
	sagaID := uuid.New()
	action := reserve(sagaID, "isolated", 4)
	e.publish(action)
	requireSuccess(t, e.replies.wait(t, action.MessageID))
	require.Equal(t, 6, e.stock("isolated"))

	comp := release(sagaID, "isolated", 4)
	e.publish(comp, comp) // and a duplicate
	requireSuccess(t, e.replies.wait(t, comp.MessageID))
	testkit.WaitFor(t, waitFor, "the duplicate is counted", func() bool { return e.duplicates(comp.MessageID) == 1 })
	require.Equal(t, 10, e.stock("isolated"), "compensated once")
	require.Equal(t, 1, e.outboxReplies(comp.MessageID), "one reply, written with the effect")
}
