package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Listen holds one connection of the pool, LISTENs on channel and calls
// onNotify for every notification, until ctx is done or the connection
// fails. It calls onNotify once right after LISTEN succeeds, so that a
// caller who reconnects after an error polls for anything it missed. The
// returned error is never nil: ctx's error, or why the connection failed.
func (s *Store) Listen(ctx context.Context, channel string, onNotify func()) error {
	pooled, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("listen on %q: acquire connection: %w", channel, err)
	}
	// A connection that was listening must not go back to the pool: it may
	// still be subscribed or half-read. It is closed instead.
	conn := pooled.Hijack()
	defer conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck // closing a broken conn
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return fmt.Errorf("listen on %q: %w", channel, err)
	}
	onNotify()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("wait for notification on %q: %w", channel, err)
		}
		onNotify()
	}
}
