package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/sagabox/sagabox/saga"
)

// DefaultAwaitPollInterval is how often Wait and Await read a saga that
// another process runs when AwaitOpts.PollInterval is zero.
const DefaultAwaitPollInterval = time.Second

// AwaitOpts tunes one Wait or Await. A nil *AwaitOpts uses defaults.
type AwaitOpts struct {
	// PollInterval is how often the saga is read while no transition of
	// this Client ends it: the floor for sagas whose final transition
	// another process (another orchestrator instance) applies. A saga that
	// this Client ends wakes the waiter at once, whatever the interval.
	// Defaults to DefaultAwaitPollInterval (1s).
	PollInterval time.Duration
}

// Outcome is how a saga ended, as Await returns it.
type Outcome[D any] struct {
	// Status is the saga's status: completed, compensated, failed (a
	// failed saga waits for an operator, but no reply or timer moves it on)
	// or terminated.
	Status saga.Status
	// Data is the saga's typed data as it ended.
	Data D
	// LastError is the saga's most recent failure reason; "" for a saga
	// that completed without one.
	LastError string
	// Saga is the full stored state.
	Saga *Saga
}

// Wait blocks until saga id is terminal (completed, compensated, failed or
// terminated) or ctx ends, and returns the saga as it then is. It is woken at once when
// this Client applies the transition that ends the saga (a reply, a timer,
// an operator action) and reads the saga every AwaitOpts.PollInterval
// otherwise, so that it also sees sagas other processes end. When ctx ends
// first it returns the saga as last read with an error wrapping ctx's; an
// unknown saga gives an error wrapping ErrNotFound.
//
// A saga started in a transaction that has not committed yet does not
// exist for Wait: wait after the commit.
func (c *Client) Wait(ctx context.Context, id uuid.UUID, opts *AwaitOpts) (*Saga, error) {
	every := DefaultAwaitPollInterval
	if opts != nil && opts.PollInterval > 0 {
		every = opts.PollInterval
	}
	// Registered before the first read, so that an end applied between the
	// read and the wait is not missed.
	ended, done := c.waiters.watch(id)
	defer func() { done() }()
	tick := time.NewTicker(every)
	defer tick.Stop()
	var last *Saga
	for {
		s, err := c.Get(ctx, id)
		switch {
		case err == nil:
			last = s
			if s.Status.Terminal() {
				return s, nil
			}
		case errors.Is(err, ErrNotFound):
			return nil, fmt.Errorf("orchestrator: wait for saga %s: %w", id, err)
		case ctx.Err() != nil:
			// The read failed because ctx ended; reported below.
		default:
			// A read that fails (e.g. a database restart) is tried again at
			// the next tick: waiting is what the caller asked for.
			c.log.Debug("wait for saga: read failed", "saga_id", id.String(), "err", err)
		}
		select {
		case <-ctx.Done():
			return last, fmt.Errorf("orchestrator: wait for saga %s: %w", id, ctx.Err())
		case <-ended:
			ended, done = c.waiters.rewatch(id, done)
		case <-tick.C:
		}
	}
}

// Await is Wait with the saga's data decoded by def, the definition the saga
// runs under (any registered version of its name decodes it; the data type
// is the definition's). It returns how the saga ended; when ctx ends first,
// the outcome so far (nil if the saga was never read) and an error wrapping
// ctx's.
func Await[D any](ctx context.Context, c *Client, def *saga.Definition[D], id uuid.UUID, opts *AwaitOpts) (*Outcome[D], error) {
	if def == nil {
		return nil, errors.New("orchestrator: await: definition is nil")
	}
	s, err := c.Wait(ctx, id, opts)
	if s == nil {
		return nil, err
	}
	if s.Type != def.Name() {
		return nil, fmt.Errorf("orchestrator: await saga %s: it is a %s saga, not %s", id, s.Type, def.Name())
	}
	data, derr := def.DecodeData(s.Data)
	if derr != nil {
		return nil, fmt.Errorf("orchestrator: await saga %s: %w", id, derr)
	}
	return &Outcome[D]{Status: s.Status, Data: data, LastError: s.LastError, Saga: s}, err
}

// GetByKey returns the saga of definition name sagaType started with
// startKey (StartOpts.StartKey), or an error wrapping ErrNotFound. With
// StartKeyReuseFinished, a key may have named several sagas over time;
// GetByKey returns the one it names now, the newest.
func (c *Client) GetByKey(ctx context.Context, sagaType, startKey string) (*Saga, error) {
	return sagaRead(c.db.SagaGetByStartKey(ctx, nil, sagaType, startKey))
}

// waiters wakes the callers of Wait when this Client ends their saga. Each
// saga waited for has one channel, closed (and forgotten) when the saga
// ends; a waiter then reads the saga and, if it is not terminal after all
// (an operator retried it meanwhile), watches a new channel.
type waiters struct {
	mu sync.Mutex
	m  map[uuid.UUID]*waiting
}

type waiting struct {
	ch chan struct{}
	n  int
}

// watch returns a channel closed when saga id ends in this process, and
// the function that stops watching it.
func (w *waiters) watch(id uuid.UUID) (<-chan struct{}, func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.m == nil {
		w.m = make(map[uuid.UUID]*waiting)
	}
	e := w.m[id]
	if e == nil {
		e = &waiting{ch: make(chan struct{})}
		w.m[id] = e
	}
	e.n++
	return e.ch, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		e.n--
		if e.n == 0 && w.m[id] == e {
			delete(w.m, id)
		}
	}
}

// rewatch stops the watch done and starts a new one.
func (w *waiters) rewatch(id uuid.UUID, done func()) (<-chan struct{}, func()) {
	done()
	return w.watch(id)
}

// ended wakes the waiters of saga id.
func (w *waiters) ended(id uuid.UUID) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if e := w.m[id]; e != nil {
		close(e.ch)
		delete(w.m, id)
	}
}
