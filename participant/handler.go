package participant

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/saga"
)

// Request is a decoded message handed to a handler: its typed payload and
// its envelope (message id, kind, saga id and type, step, attempt, trace
// context).
type Request[T any] struct {
	// Envelope is the message's metadata. Envelope.Attempt is the saga's
	// send attempt of the command (1 for the first send; a re-send after a
	// timeout has a new MessageID and a higher Attempt).
	message.Envelope
	// Data is the payload, decoded strictly into T.
	Data T
	// DeliveryAttempt is 1 the first time this participant processes the
	// message and n after n-1 transient failures.
	DeliveryAttempt int
}

// CommandFunc handles a saga step's action. It runs in tx, the transaction
// that also records the message in the inbox and the reply in the outbox:
// do the business writes in tx and never commit or roll it back. It returns
// the success reply; Reject(err) for a business "no" (the saga compensates);
// any other error is transient and the message is retried.
type CommandFunc[Req, Reply any] func(ctx context.Context, tx pgx.Tx, req *Request[Req]) (Reply, error)

// CompensationFunc undoes a step's action in tx. It runs only if the action
// was applied here, at most once per saga step. A compensation cannot
// reject: every error is transient and retried; when the retries run out
// the orchestrator gets a failure reply and the saga becomes failed.
type CompensationFunc[Req any] func(ctx context.Context, tx pgx.Tx, req *Request[Req]) error

// EventFunc handles a plain domain event in tx, once per message.
type EventFunc[E any] func(ctx context.Context, tx pgx.Tx, ev *Request[E]) error

// Reject marks err as a business rejection: the command is answered with a
// failure reply (reason err.Error()) and the saga compensates the steps
// before it. The handler's writes in tx are rolled back; the rejection is
// recorded so that a re-sent command gets the same answer. Any error that is
// not a rejection is transient and retried. Reject(nil) returns nil.
func Reject(err error) error {
	return RejectWithCode("", err)
}

// RejectWithCode is Reject with a machine-readable code for the failure
// reply (saga.Failure.Code), e.g. "out_of_stock".
func RejectWithCode(code string, err error) error {
	if err == nil {
		return nil
	}
	return &rejection{code: code, err: err}
}

type rejection struct {
	code string
	err  error
}

func (r *rejection) Error() string   { return r.err.Error() }
func (r *rejection) Unwrap() []error { return []error{saga.ErrRejected, r.err} }

// failureOf returns the failure reply of a rejection.
func failureOf(err error) saga.Failure {
	f := saga.Failure{Reason: err.Error()}
	var r *rejection
	if errors.As(err, &r) {
		f.Code = r.code
	}
	if f.Reason == "" {
		f.Reason = "rejected"
	}
	return f
}

// handler is a registered handler with its types erased.
type handler struct {
	kind message.Kind
	typ  string
	// decode decodes a payload strictly.
	decode func(payload []byte) (any, error)
	// call runs the user's function; reply is the success reply payload.
	call func(ctx context.Context, tx pgx.Tx, env *message.Envelope, data any, attempt int) (reply []byte, err error)
	// outside is set, instead of call, for a handler that calls an outside
	// system (HandleOutsideCommand, HandleOutsideCompensation).
	outside *outsideHandler
}

type handlerKey struct {
	kind message.Kind
	typ  string
}

// HandleCommand registers fn as the handler of cmd's commands (saga step
// actions). A success reply carries fn's Reply; a rejection a failure
// reply; see CommandFunc. Register every handler before Run. It panics if a
// command handler for cmd's name is already registered, the name is empty,
// or the Client is running.
func HandleCommand[Req, Reply any](c *Client, cmd saga.Command[Req, Reply], fn CommandFunc[Req, Reply]) {
	if fn == nil {
		panic("participant: HandleCommand: fn is nil")
	}
	c.register(&handler{
		kind: message.KindCommand,
		typ:  cmd.Name(),
		decode: func(payload []byte) (any, error) {
			return cmd.DecodeRequest(payload)
		},
		call: func(ctx context.Context, tx pgx.Tx, env *message.Envelope, data any, attempt int) ([]byte, error) {
			reply, err := fn(ctx, tx, &Request[Req]{Envelope: *env, Data: as[Req](data), DeliveryAttempt: attempt})
			if err != nil {
				return nil, err
			}
			b, err := cmd.EncodeReply(reply)
			if err != nil {
				return nil, fmt.Errorf("handler of %s returned a reply that does not encode: %w", cmd.Name(), err)
			}
			return b, nil
		},
	})
}

// HandleCompensation registers fn as the handler of cmd's compensation
// messages. cmd is the compensation's contract (the command named in the
// step's saga.Compensate), not the action's. A step's action and its
// compensation must be handled by the same participant (the same schema):
// the barrier that orders them lives there. The success reply carries no
// data ({}). It panics like HandleCommand.
func HandleCompensation[Req, R any](c *Client, cmd saga.Command[Req, R], fn CompensationFunc[Req]) {
	if fn == nil {
		panic("participant: HandleCompensation: fn is nil")
	}
	c.register(&handler{
		kind: message.KindCompensation,
		typ:  cmd.Name(),
		decode: func(payload []byte) (any, error) {
			return cmd.DecodeRequest(payload)
		},
		call: func(ctx context.Context, tx pgx.Tx, env *message.Envelope, data any, attempt int) ([]byte, error) {
			return []byte("{}"), fn(ctx, tx, &Request[Req]{Envelope: *env, Data: as[Req](data), DeliveryAttempt: attempt})
		},
	})
}

// HandleEvent registers fn as the handler of plain domain events (outside
// sagas) of eventType, decoded strictly into E. Each event is handled once
// (inbox); nothing is replied. It panics like HandleCommand.
func HandleEvent[E any](c *Client, eventType string, fn EventFunc[E]) {
	if fn == nil {
		panic("participant: HandleEvent: fn is nil")
	}
	// An event outside sagas has the same contract as one a saga waits for:
	// a name and a payload type, decoded strictly.
	contract := saga.NewEventType[E](eventType)
	c.register(&handler{
		kind: message.KindEvent,
		typ:  eventType,
		decode: func(payload []byte) (any, error) {
			return contract.Decode(payload)
		},
		call: func(ctx context.Context, tx pgx.Tx, env *message.Envelope, data any, attempt int) ([]byte, error) {
			return nil, fn(ctx, tx, &Request[E]{Envelope: *env, Data: as[E](data), DeliveryAttempt: attempt})
		},
	})
}

// NewEvent returns a plain domain event of eventType with data encoded as
// JSON, ready for Client.Publish. Its routing key is eventType.
func NewEvent(eventType string, data any) (message.Message, error) {
	if strings.TrimSpace(eventType) == "" {
		return message.Message{}, errors.New("participant: new event: eventType is empty")
	}
	b, err := json.Marshal(data)
	if err != nil {
		return message.Message{}, fmt.Errorf("participant: encode %s event: %w", eventType, err)
	}
	return message.Message{
		Envelope: message.Envelope{Type: eventType, Kind: message.KindEvent, RoutingKey: eventType},
		Payload:  b,
	}, nil
}

// as returns v as a T, or T's zero value when v is nil (an interface-typed
// payload decoded from null).
func as[T any](v any) T {
	t, _ := v.(T)
	return t
}
