package faulttest

import (
	"context"
	"errors"
	"time"

	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/transport"
)

// errConfirmLost is what a broker whose confirm was "lost" reports to the
// relay: the message is on the broker, but the relay does not know it.
var errConfirmLost = errors.New("faulttest: confirm lost (the message was published)")

// faultyBroker wraps a client's broker connection and injects the faults of
// the transport seam: duplicate publishes (at once and later), lost
// confirms, held deliveries and lost acks.
type faultyBroker struct {
	inner transport.Broker
	inj   *injector
	gated bool // the orchestrator's
}

var (
	_ transport.Broker       = (*faultyBroker)(nil)
	_ transport.Availability = (*faultyBroker)(nil)
)

// Publish publishes msgs and may publish some again, now or after a delay,
// or report a confirmed batch as unconfirmed so that the relay publishes it
// again: what a relay that crashed between publish and mark does.
func (b *faultyBroker) Publish(ctx context.Context, msgs ...message.Message) error {
	if err := b.inner.Publish(ctx, msgs...); err != nil {
		return err
	}
	for _, m := range msgs {
		if b.inj.roll(b.inj.faults.Duplicate) {
			if b.inner.Publish(ctx, m) == nil {
				b.inj.count(FaultDuplicate)
			}
		}
		if b.inj.roll(b.inj.faults.DelayedDuplicate) {
			b.inj.later(m)
		}
	}
	if b.inj.roll(b.inj.faults.LostConfirm) {
		b.inj.count(FaultLostConfirm)
		failed := make(map[int]error, len(msgs))
		for i := range msgs {
			failed[i] = errConfirmLost
		}
		return &transport.PublishError{Failed: failed}
	}
	return nil
}

// Declare declares spec on the wrapped broker.
func (b *faultyBroker) Declare(ctx context.Context, spec transport.QueueSpec) error {
	return b.inner.Declare(ctx, spec)
}

// Subscribe subscribes h, wrapped so that its deliveries suffer faults.
func (b *faultyBroker) Subscribe(ctx context.Context, spec transport.QueueSpec, h transport.Handler, opts *transport.SubscribeOpts) error {
	w := &faultyHandler{inner: h, inj: b.inj, gated: b.gated}
	if bh, ok := h.(transport.BatchHandler); ok {
		return b.inner.Subscribe(ctx, spec, &faultyBatchHandler{faultyHandler: w, batch: bh}, opts)
	}
	return b.inner.Subscribe(ctx, spec, w, opts)
}

// Close closes the wrapped broker.
func (b *faultyBroker) Close() error { return b.inner.Close() }

// Unavailable passes on the wrapped broker's availability, if it knows it.
func (b *faultyBroker) Unavailable() time.Time {
	if a, ok := b.inner.(transport.Availability); ok {
		return a.Unavailable()
	}
	return time.Time{}
}

// faultyHandler injects the faults of the receiving side.
type faultyHandler struct {
	inner transport.Handler
	inj   *injector
	gated bool // the orchestrator's: held while deadlines fire
}

// hold delays a delivery, so that others overtake it, and holds the
// orchestrator's replies while the steps they answer time out.
func (h *faultyHandler) hold(ctx context.Context) {
	if h.gated {
		h.inj.waitGate(ctx)
	}
	if !h.inj.roll(h.inj.faults.Hold) {
		return
	}
	h.inj.count(FaultHold)
	t := time.NewTimer(h.inj.duration(h.inj.faults.MaxDelay))
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// HandleDelivery handles d, with faults.
func (h *faultyHandler) HandleDelivery(ctx context.Context, d *transport.Delivery) transport.Outcome {
	h.hold(ctx)
	return h.loseAck(h.inner.HandleDelivery(ctx, d))
}

// loseAck turns an ack into a redelivery, as a crash between the commit of a
// delivery and its ack does.
func (h *faultyHandler) loseAck(out transport.Outcome) transport.Outcome {
	if out.Action == transport.ActionAck && h.inj.roll(h.inj.faults.LostAck) {
		h.inj.count(FaultLostAck)
		return transport.Retry(0)
	}
	return out
}

// faultyBatchHandler is a faultyHandler for a handler that takes batches.
type faultyBatchHandler struct {
	*faultyHandler
	batch transport.BatchHandler
}

// HandleBatch handles ds, with faults.
func (h *faultyBatchHandler) HandleBatch(ctx context.Context, ds []*transport.Delivery) []transport.Outcome {
	h.hold(ctx)
	outs := h.batch.HandleBatch(ctx, ds)
	for i := range outs {
		outs[i] = h.loseAck(outs[i])
	}
	return outs
}
