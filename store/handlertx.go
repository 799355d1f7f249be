package store

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// handlerTx is the transaction a participant's handler is given: the
// savepoint handlerSavepoint of the delivery's transaction, begun in the
// round trip that began the delivery. Its statements run in the delivery's
// transaction; its Commit releases the savepoint and its Rollback rolls back
// to it, so that a handler that ends "its" transaction cannot end the one
// that also holds the inbox record, the barrier mark and the reply. Begin
// starts a savepoint inside it.
type handlerTx struct {
	pgx.Tx
	t *engineTx
	// closed is set once the savepoint is released or rolled back, or the
	// delivery finished; released once the handler released it.
	closed, released bool
}

func (h *handlerTx) Commit(ctx context.Context) error {
	if h.closed {
		return pgx.ErrTxClosed
	}
	h.closed, h.released = true, true
	_, err := h.Tx.Exec(ctx, "release savepoint "+handlerSavepoint)
	return err
}

func (h *handlerTx) Rollback(ctx context.Context) error {
	if h.closed {
		return pgx.ErrTxClosed
	}
	h.closed = true
	_, err := h.Tx.Exec(ctx, "rollback to savepoint "+handlerSavepoint)
	return err
}

func (h *handlerTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if h.closed {
		return nil, pgx.ErrTxClosed
	}
	return h.Tx.Begin(ctx)
}

func (h *handlerTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if h.closed {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	tag, err := h.Tx.Exec(ctx, sql, args...)
	return tag, h.t.lost(err)
}

func (h *handlerTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if h.closed {
		return nil, pgx.ErrTxClosed
	}
	rows, err := h.Tx.Query(ctx, sql, args...)
	if err != nil {
		return nil, h.t.lost(err)
	}
	return &handlerRows{Rows: rows, t: h.t}, nil
}

func (h *handlerTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if h.closed {
		return errRow{pgx.ErrTxClosed}
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
	if h.closed {
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	}
	return h.Tx.SendBatch(ctx, b)
}

func (h *handlerTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, rows pgx.CopyFromSource) (int64, error) {
	if h.closed {
		return 0, pgx.ErrTxClosed
	}
	return h.Tx.CopyFrom(ctx, table, columns, rows)
}
