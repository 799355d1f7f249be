package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// handlerTx is the transaction a participant's handler is given: the
// savepoint handlerSavepoint of the delivery's transaction, begun in the
// round trip that began the delivery (or, lazy, in the one of the handler's
// first statement: a handler that does not touch the database costs no
// savepoint). Its statements run in the delivery's transaction; its Commit
// releases the savepoint and its Rollback rolls back to it, so that a
// handler that ends "its" transaction cannot end the one that also holds
// the inbox record, the barrier mark and the reply. Begin starts a
// savepoint inside it.
type handlerTx struct {
	pgx.Tx
	t *engineTx
	// lazy is set while the savepoint waits for the handler's first
	// statement.
	lazy bool
	// closed is set once the savepoint is released or rolled back, or the
	// delivery finished; released once the handler released it.
	closed, released bool
}

// open begins a lazy savepoint, with the statements the transaction has
// pending, before the handler's first statement.
func (h *handlerTx) open(ctx context.Context) error {
	if h.closed {
		return pgx.ErrTxClosed
	}
	if !h.lazy {
		return nil
	}
	if _, err := h.t.exec(ctx, false).Exec(ctx, "savepoint "+handlerSavepoint); err != nil {
		return h.t.lost(err)
	}
	h.lazy = false
	return nil
}

// Conn returns the delivery's connection. A lazy savepoint is begun first,
// so that statements the handler sends on the connection directly run
// inside it; should beginning it fail, the delivery's transaction cannot
// commit any more.
func (h *handlerTx) Conn() *pgx.Conn {
	if err := h.open(context.Background()); err != nil && !errors.Is(err, pgx.ErrTxClosed) && h.t.err == nil {
		h.t.err = fmt.Errorf("begin the handler's savepoint: %w", err)
	}
	return h.Tx.Conn()
}

// Prepare prepares sql on the delivery's connection, inside the handler's
// savepoint.
func (h *handlerTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := h.open(ctx); err != nil {
		return nil, err
	}
	return h.Tx.Prepare(ctx, name, sql)
}

// LargeObjects returns the large objects of the delivery's transaction; a
// lazy savepoint is begun first, as Conn does.
func (h *handlerTx) LargeObjects() pgx.LargeObjects {
	_ = h.Conn()
	return h.Tx.LargeObjects()
}

func (h *handlerTx) Commit(ctx context.Context) error {
	if h.closed {
		return pgx.ErrTxClosed
	}
	h.closed = true
	if h.lazy {
		return nil // nothing to release: the handler wrote nothing
	}
	h.released = true
	_, err := h.Tx.Exec(ctx, "release savepoint "+handlerSavepoint)
	return err
}

func (h *handlerTx) Rollback(ctx context.Context) error {
	if h.closed {
		return pgx.ErrTxClosed
	}
	h.closed = true
	if h.lazy {
		return nil
	}
	_, err := h.Tx.Exec(ctx, "rollback to savepoint "+handlerSavepoint)
	return err
}

func (h *handlerTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := h.open(ctx); err != nil {
		return nil, err
	}
	sp, err := h.Tx.Begin(ctx)
	if err != nil {
		return nil, h.t.lost(err)
	}
	return &savepointTx{Tx: sp, t: h.t}, nil
}

func (h *handlerTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := h.open(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := h.Tx.Exec(ctx, sql, args...)
	return tag, h.t.lost(err)
}

func (h *handlerTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := h.open(ctx); err != nil {
		return nil, err
	}
	rows, err := h.Tx.Query(ctx, sql, args...)
	if err != nil {
		return nil, h.t.lost(err)
	}
	return &handlerRows{Rows: rows, t: h.t}, nil
}

func (h *handlerTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := h.open(ctx); err != nil {
		return errRow{err}
	}
	return handlerRow{row: h.Tx.QueryRow(ctx, sql, args...), t: h.t}
}

// handlerRows and handlerRow mark their errors as a lost connection when
// pgx closed the delivery's connection under them, so that a handler that
// returns (or wraps) them has its delivery retried without counting an
// attempt.
type handlerRows struct {
	pgx.Rows
	t *engineTx
}

func (r *handlerRows) Err() error { return r.t.lost(r.Rows.Err()) }

type handlerRow struct {
	row pgx.Row
	t   *engineTx
}

func (r handlerRow) Scan(dest ...any) error { return r.t.lost(r.row.Scan(dest...)) }

func (h *handlerTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := h.open(ctx); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return handlerBatch{BatchResults: h.Tx.SendBatch(ctx, b), t: h.t}
}

// handlerBatch marks the errors of a handler's batch as handlerRows does
// those of its queries.
type handlerBatch struct {
	pgx.BatchResults
	t *engineTx
}

func (b handlerBatch) Exec() (pgconn.CommandTag, error) {
	tag, err := b.BatchResults.Exec()
	return tag, b.t.lost(err)
}

func (b handlerBatch) Query() (pgx.Rows, error) {
	rows, err := b.BatchResults.Query()
	if err != nil {
		return rows, b.t.lost(err)
	}
	return &handlerRows{Rows: rows, t: b.t}, nil
}

func (b handlerBatch) QueryRow() pgx.Row { return handlerRow{row: b.BatchResults.QueryRow(), t: b.t} }

func (b handlerBatch) Close() error { return b.t.lost(b.BatchResults.Close()) }

func (h *handlerTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, rows pgx.CopyFromSource) (int64, error) {
	if err := h.open(ctx); err != nil {
		return 0, err
	}
	n, err := h.Tx.CopyFrom(ctx, table, columns, rows)
	return n, h.t.lost(err)
}

// savepointTx is a savepoint of an engine transaction handed to code that
// does its own writes in it (a local step, a handler's nested
// transaction): its statements' errors are marked as the transaction's
// own are (engineTx.lost), and its savepoints are savepointTx too.
type savepointTx struct {
	pgx.Tx
	t *engineTx
}

func (s *savepointTx) Begin(ctx context.Context) (pgx.Tx, error) {
	sp, err := s.Tx.Begin(ctx)
	if err != nil {
		return nil, s.t.lost(err)
	}
	return &savepointTx{Tx: sp, t: s.t}, nil
}

func (s *savepointTx) Commit(ctx context.Context) error { return s.t.lost(s.Tx.Commit(ctx)) }

func (s *savepointTx) Rollback(ctx context.Context) error { return s.t.lost(s.Tx.Rollback(ctx)) }

func (s *savepointTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tag, err := s.Tx.Exec(ctx, sql, args...)
	return tag, s.t.lost(err)
}

func (s *savepointTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	rows, err := s.Tx.Query(ctx, sql, args...)
	if err != nil {
		return nil, s.t.lost(err)
	}
	return &handlerRows{Rows: rows, t: s.t}, nil
}

func (s *savepointTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return handlerRow{row: s.Tx.QueryRow(ctx, sql, args...), t: s.t}
}

func (s *savepointTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return handlerBatch{BatchResults: s.Tx.SendBatch(ctx, b), t: s.t}
}

func (s *savepointTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, rows pgx.CopyFromSource) (int64, error) {
	n, err := s.Tx.CopyFrom(ctx, table, columns, rows)
	return n, s.t.lost(err)
}
