package store_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store"
)

// A connection that drops mid-statement (the server was killed, or the
// network between died) is a connection error, not the statement's fault:
// the engine retries such a delivery without counting it against the
// message's attempts. The connection goes through a TCP forwarder that the
// test cuts while the delivery's first statement waits for a lock, so pgx
// reads a bare unexpected EOF, as it does when the server is SIGKILLed.
func TestConnectionDroppedMidStatementIsAConnectionError(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(dbtest.URL())
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	target := u.Host
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, s)
			mu.Unlock()
			// An end that closes closes the other, as a real network path
			// would carry it.
			wg.Go(func() { _, _ = io.Copy(s, c); _ = s.Close() })
			wg.Go(func() { _, _ = io.Copy(c, s); _ = c.Close() })
		}
	})
	cut := func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	}
	t.Cleanup(func() {
		_ = ln.Close()
		cut()
		wg.Wait()
	})

	u.Host = ln.Addr().String()
	q := u.Query()
	q.Set("sslmode", "disable")
	u.RawQuery = q.Encode()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A migrated schema, and a store of it whose one connection goes
	// through the forwarder.
	shared := dbtest.Store(t, store.LineMessaging)
	cfg, err := pgxpool.ParseConfig(u.String())
	require.NoError(t, err)
	cfg.MaxConns = 1
	proxied, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(proxied.Close)
	s, err := store.New(proxied, shared.Schema())
	require.NoError(t, err)
	ex := s.Executor()

	var pid uint32
	require.NoError(t, proxied.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	t.Cleanup(func() {
		// The server notices the lost client only when it next writes to
		// it: end the backend, so that it leaves no transaction open.
		_, _ = shared.Pool.Exec(context.Background(), "SELECT pg_terminate_backend($1)", pid)
	})

	// The store's own statement is in flight when the connection drops: the
	// delivery's first statement waits for another delivery of the same
	// message, which holds its inbox key.
	env := command(uuid.New(), message.KindCommand)
	holder := shared.Begin()
	defer holder.Rollback(ctx)
	_, err = shared.BeginDelivery(ctx, holder, env, nil)
	require.NoError(t, err)
	tx := ex.Begin()
	defer tx.Rollback(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := ex.BeginDelivery(ctx, tx, env, nil)
		done <- err
	}()
	require.Eventually(t, func() bool {
		var n int
		err := shared.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'`, pid).Scan(&n)
		return err == nil && n > 0
	}, 20*time.Second, 10*time.Millisecond, "the delivery to wait for the other one")
	cut()
	err = <-done
	require.Error(t, err)
	t.Logf("the delivery's statement failed with: %v", err)
	require.True(t, store.IsConnectionError(fmt.Errorf("deliver: %w", err)), "a statement on a dropped connection (%v) is a connection error", err)
	holder.Rollback(ctx)
	require.False(t, store.IsConnectionError(context.Canceled))
	require.False(t, store.IsConnectionError(errors.New("handler failed")))
}
