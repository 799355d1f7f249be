package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// notifyChannel is the LISTEN/NOTIFY channel on which the relays of the
// store's schema are woken.
func (s *Store) notifyChannel() string { return "sagabox_outbox_" + s.schema }

// OutboxNotify wakes the relays of the store's schema that Listen in other
// processes once tx commits: call it in a transaction that wrote to the
// outbox from a process whose own relay does not run (a web process that
// starts sagas). NOTIFY serialises the commits of the transactions that
// send it, so it is opt-in.
func (s *executor) OutboxNotify(ctx context.Context, tx pgx.Tx) error {
	if err := s.queries.OutboxNotify(ctx, s.db(tx), s.notifyChannel()); err != nil {
		return fmt.Errorf("notify relays of schema %q: %w", s.schema, err)
	}
	return nil
}

// OutboxListen holds one connection of the pool, LISTENs on the schema's channel
// and calls onNotify for every notification, until ctx is done or the
// connection fails. It calls onNotify once right after LISTEN succeeds, so
// that a caller who reconnects after an error polls for anything it missed.
// The returned error is never nil: ctx's error, or why the connection
// failed.
func (s *executor) OutboxListen(ctx context.Context, onNotify func()) error {
	if s.pool == nil {
		return fmt.Errorf("store for schema %q has no connection pool", s.schema)
	}
	channel := s.notifyChannel()
	pooled, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("listen on %q: acquire connection: %w", channel, interpretError(err))
	}
	// A connection that was listening must not go back to the pool: it may
	// still be subscribed or half-read. It is closed instead.
	conn := pooled.Hijack()
	defer conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck // closing a broken conn
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return fmt.Errorf("listen on %q: %w", channel, lostConn(conn, err))
	}
	onNotify()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("wait for notification on %q: %w", channel, lostConn(conn, err))
		}
		onNotify()
	}
}
