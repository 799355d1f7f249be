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
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/store/driver"
)

// A connection that drops mid-statement (the server was killed, or the
// network between died) is a connection error, not the statement's fault:
// the engine retries such a delivery without counting it against the
// message's attempts. The connection goes through a TCP forwarder that the
// test cuts while the delivery's first statement waits for a lock, so pgx
// reads a bare unexpected EOF, as it does when the server is SIGKILLed.
func TestConnectionDroppedMidStatementIsAConnectionError(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := newDroppable(t)

	// The store's own statement is in flight when the connection drops: the
	// delivery's first statement waits for another delivery of the same
	// message, which holds its inbox key.
	env := command(uuid.New(), message.KindCommand)
	holder := p.shared.Begin(nil)
	defer holder.Rollback(ctx)
	_, err := p.shared.DeliveryBegin(ctx, holder, env, nil)
	require.NoError(t, err)
	tx := p.ex.Begin(nil)
	defer tx.Rollback(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := p.ex.DeliveryBegin(ctx, tx, env, nil)
		done <- err
	}()
	require.Eventually(t, func() bool {
		var n int
		err := p.shared.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'`, p.pid).Scan(&n)
		return err == nil && n > 0
	}, 20*time.Second, 10*time.Millisecond, "the delivery to wait for the other one")
	p.cut()
	err = <-done
	require.Error(t, err)
	t.Logf("the delivery's statement failed with: %v", err)
	require.ErrorIs(t, err, driver.ErrConnection, "the driver marks its statement's error on a dropped connection")
	require.True(t, store.IsConnectionError(fmt.Errorf("deliver: %w", err)), "a statement on a dropped connection (%v) is a connection error", err)
	holder.Rollback(ctx)
	require.False(t, store.IsConnectionError(context.Canceled))
	require.False(t, store.IsConnectionError(errors.New("handler failed")))
}

// Whatever pgx call a handler makes on its transaction, its error on a
// connection that dropped is a connection error: a handler that returns it
// (or wraps it) has its delivery retried without counting an attempt, and
// a database restart does not dead-letter the messages it interrupts.
func TestHandlerStatementsOnADroppedConnectionAreConnectionErrors(t *testing.T) {
	t.Parallel()
	calls := map[string]func(ctx context.Context, tx pgx.Tx) error{
		"Exec": func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "SELECT 1")
			return err
		},
		"Query": func(ctx context.Context, tx pgx.Tx) error {
			rows, err := tx.Query(ctx, "SELECT 1")
			if err != nil {
				return err
			}
			rows.Close()
			return rows.Err()
		},
		"QueryRow": func(ctx context.Context, tx pgx.Tx) error {
			var n int
			return tx.QueryRow(ctx, "SELECT 1").Scan(&n)
		},
		"SendBatch Exec": func(ctx context.Context, tx pgx.Tx) error {
			b := &pgx.Batch{}
			b.Queue("SELECT 1")
			br := tx.SendBatch(ctx, b)
			_, err := br.Exec()
			_ = br.Close()
			return err
		},
		"SendBatch Query": func(ctx context.Context, tx pgx.Tx) error {
			b := &pgx.Batch{}
			b.Queue("SELECT 1")
			br := tx.SendBatch(ctx, b)
			defer func() { _ = br.Close() }()
			rows, err := br.Query()
			if err != nil {
				return err
			}
			rows.Close()
			return rows.Err()
		},
		"SendBatch QueryRow": func(ctx context.Context, tx pgx.Tx) error {
			b := &pgx.Batch{}
			b.Queue("SELECT 1")
			br := tx.SendBatch(ctx, b)
			defer func() { _ = br.Close() }()
			var n int
			return br.QueryRow().Scan(&n)
		},
		"SendBatch Close": func(ctx context.Context, tx pgx.Tx) error {
			b := &pgx.Batch{}
			b.Queue("SELECT 1")
			return tx.SendBatch(ctx, b).Close()
		},
		"CopyFrom": func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.CopyFrom(ctx, pgx.Identifier{"pg_temp", "t"}, []string{"n"}, pgx.CopyFromRows([][]any{{1}}))
			return err
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			p := newDroppable(t)
			tx := p.ex.Begin(nil)
			defer tx.Rollback(ctx)
			d, err := p.ex.DeliveryBegin(ctx, tx, command(uuid.New(), message.KindCommand), nil)
			require.NoError(t, err)
			// The handler's savepoint is open, the connection is idle in
			// its transaction: then the network between goes.
			_, err = d.Tx.Exec(ctx, "SELECT 1")
			require.NoError(t, err)
			p.cut()
			err = call(ctx, d.Tx)
			require.Error(t, err)
			require.ErrorIs(t, err, driver.ErrConnection, "%s on a dropped connection is marked by the driver", name)
			require.True(t, store.IsConnectionError(fmt.Errorf("handler: %w", err)), "%s on a dropped connection: %v", name, err)
		})
	}
}

// droppable is a store whose one connection goes through a TCP forwarder
// that the test can cut, as a network fault or a killed server would.
type droppable struct {
	// shared is a store of the same schema on the ordinary pool.
	shared *dbtest.DB
	ex     driver.Executor
	// pid is the server process of the forwarded connection.
	pid uint32
	cut func()
}

func newDroppable(t *testing.T) *droppable {
	t.Helper()
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
	ex, err := store.NewExecutor(proxied, shared.Schema())
	require.NoError(t, err)

	var pid uint32
	require.NoError(t, proxied.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	t.Cleanup(func() {
		// The server notices the lost client only when it next writes to
		// it: end the backend, so that it leaves no transaction open.
		_, _ = shared.Pool.Exec(context.Background(), "SELECT pg_terminate_backend($1)", pid)
	})
	return &droppable{shared: shared, ex: ex, pid: pid, cut: cut}
}

// A handler's own statement that outlives its context is the handler's
// failure, counted against the message's attempts, although pgx closes the
// connection under it.
func TestHandlerTimeoutIsNotAConnectionError(t *testing.T) {
	t.Parallel()
	db := dbtest.Store(t, store.LineMessaging)
	ctx := context.Background()
	env := command(uuid.New(), message.KindCommand)
	tx := db.Begin(nil)
	defer tx.Rollback(ctx)
	d, err := db.DeliveryBegin(ctx, tx, env, nil)
	require.NoError(t, err)
	qctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err = d.Tx.Exec(qctx, "SELECT pg_sleep(2)")
	require.Error(t, err)
	require.False(t, store.IsConnectionError(err), "%v", err)
}

// The driver marks PostgreSQL's errors at the seam with its own sentinels,
// by SQLSTATE and pgx's error types, keeping their messages: the engine
// tells what a failure calls for without importing store.
func TestInterpretErrorMarksByClass(t *testing.T) {
	t.Parallel()
	s := dbtest.Store(t, store.LineMessaging)
	for _, tc := range []struct {
		err  error
		mark error
	}{
		{&pgconn.PgError{Code: "40001", Message: "could not serialize access"}, driver.ErrConflict},
		{&pgconn.PgError{Code: "40P01", Message: "deadlock detected"}, driver.ErrConflict},
		{&pgconn.PgError{Code: "08006", Message: "connection failure"}, driver.ErrConnection},
		{&pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"}, driver.ErrConnection},
		{&pgconn.PgError{Code: "22021", Message: "invalid byte sequence"}, driver.ErrDataRefused},
		{&pgconn.PgError{Code: "54000", Message: "index row size exceeds maximum"}, driver.ErrDataRefused},
		{pgconn.ErrConnClosed, driver.ErrConnection},
	} {
		wrapped := fmt.Errorf("handler: %w", tc.err)
		got := s.InterpretError(wrapped)
		require.ErrorIs(t, got, tc.mark, "%v", tc.err)
		require.ErrorIs(t, got, tc.err, "the database's error stays in the chain")
		require.Equal(t, wrapped.Error(), got.Error(), "the message is the database's")
	}
	for _, err := range []error{
		&pgconn.PgError{Code: "23505", Message: "duplicate key"}, errors.New("handler failed"), context.Canceled,
	} {
		got := s.InterpretError(err)
		for _, mark := range []error{driver.ErrConflict, driver.ErrConnection, driver.ErrDataRefused} {
			require.NotErrorIs(t, got, mark, "%v", err)
		}
	}
	require.NoError(t, s.InterpretError(nil))

	// A statement the database refuses comes back marked from the
	// executor itself.
	tx := s.Begin(nil)
	defer tx.Rollback(context.Background())
	_, err := s.InboxRecord(context.Background(), tx, &message.Envelope{MessageID: uuid.New(), Kind: message.KindEvent, Type: "bad\x00type"})
	require.ErrorIs(t, err, driver.ErrDataRefused, "%v", err)
}
