package store

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/sagabox/sagabox/store/driver"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sagabox/sagabox/store/internal/dbsqlc"
)

// planGeneric makes the statements after it, in its transaction, run on
// their generic plans, and stashes the setting it replaces for planSession
// to restore. It is for statements whose parameters are arrays (a batch's
// rows): PostgreSQL's plan cache judges their generic plan dearer than a
// custom plan for one element and so plans each execution anew, and the
// planning cost more than the execution (SagaReceive: about 0.45 ms of
// planning per reply against 0.2 ms of execution, in a three-step saga
// bench at 60 sagas/s). Their generic plans are the same lookups by primary
// key the custom plans find. Both settings are local to the transaction.
const (
	planGeneric = "select set_config('sagabox.plan_cache_mode', current_setting('plan_cache_mode'), true), " +
		"set_config('plan_cache_mode', 'force_generic_plan', true)"
	planSession = "select set_config('plan_cache_mode', current_setting('sagabox.plan_cache_mode'), true)"
)

// session is the connection and transaction of an engineTx.
type session struct {
	s    *Store
	conn *pgxpool.Conn
	// tx is the connection's transaction once BEGIN was sent.
	tx pgx.Tx
	// pending are statements that go out ahead of the next operation's
	// statement, or with COMMIT: a handler's savepoint released or rolled
	// back, a statement sent ahead, an operation's write that ends the
	// transaction.
	pending []*pendingStmt
	// err is the failure of a statement sent ahead: the transaction cannot
	// commit any more.
	err error
}

// pendingStmt is a statement queued to go out with the next operation's,
// or with COMMIT.
type pendingStmt struct {
	sql  string
	args []any
	// what names the statement in its error; its first line when empty.
	what string
	// read reads the statement's result from the batch; nil reads a
	// command tag.
	read func(br pgx.BatchResults) error
	// restore marks a statement that only restores a setting local to the
	// transaction: right before COMMIT it is not sent.
	restore bool
}

// engineTx is driver.Tx on a connection of the pool: BEGIN goes out in one
// batch with the first operation's statement (pgx's Batch.BeginTx), and
// COMMIT with the statements pending at Commit. It carries the write-time
// lease it was begun with, and what its writes did to the outbox, which
// Commit returns.
type engineTx struct {
	*session
	done bool
	// lease is the relay's write-time lease (driver.BeginOpts.Lease); nil
	// for none.
	lease *driver.OutboxLease
	// committed is what the transaction's writes did to the outbox, as far
	// as known; afterCommit completes it (the rows a write leased are read
	// with its result) and brings the written sagas up to date.
	committed   driver.Committed
	afterCommit []func()
}

// Begin implements driver.Executor.
func (s *executor) Begin(opts *driver.BeginOpts) driver.Tx {
	t := &engineTx{session: &session{s: s.Store}}
	if opts != nil && opts.Lease != nil && opts.Lease.Lease > 0 {
		t.lease = opts.Lease
	}
	return t
}

// txOf returns the engineTx behind t, which this package's Begin made.
func txOf(t driver.Tx) *engineTx { return t.(*engineTx) }

// engineTxOf returns the engine transaction tx is a savepoint of (a
// handler's transaction, a local step's savepoint), or nil when tx is a
// caller's own.
func engineTxOf(tx pgx.Tx) *engineTx {
	switch tx := tx.(type) {
	case *handlerTx:
		return tx.t
	case *savepointTx:
		return tx.t
	}
	return nil
}

// noteUnleased counts rows written to the schema's outbox in tx without the
// write-time lease, when tx is a savepoint of one of the schema's engine
// transactions: a claim must find them, so that transaction's Commit tells
// (driver.Committed.Unleased).
func (s *Store) noteUnleased(tx pgx.Tx, rows int) {
	if t := engineTxOf(tx); t != nil && t.s.schema == s.schema {
		t.committed.Unleased += rows
	}
}

// Rollback implements driver.Tx: it ends t without committing what it did
// and gives its connection back.
func (t *engineTx) Rollback(ctx context.Context) {
	if t.done {
		return
	}
	t.done = true
	t.pending, t.afterCommit = nil, nil
	if t.conn == nil {
		return
	}
	if t.conn.Conn().PgConn().TxStatus() != 'I' && !t.conn.Conn().IsClosed() {
		if _, err := t.conn.Exec(context.WithoutCancel(ctx), "rollback"); err != nil {
			// The connection is broken; the pool destroys it on release.
			_ = t.conn.Conn().Close(context.WithoutCancel(ctx))
		}
	}
	t.conn.Release()
	t.conn = nil
}

// Savepoint implements driver.Tx.
func (t *engineTx) Savepoint(ctx context.Context) (pgx.Tx, error) {
	if t.done {
		return nil, pgx.ErrTxClosed
	}
	if t.tx == nil {
		if err := t.begin(ctx); err != nil {
			return nil, err
		}
	}
	sp, err := t.tx.Begin(ctx)
	if err != nil {
		return nil, t.lost(err)
	}
	return &savepointTx{Tx: sp, t: t}, nil
}

// Commit implements driver.Tx: the pending statements and COMMIT go out in
// one round trip (with BEGIN, for a transaction that has not begun).
func (t *engineTx) Commit(ctx context.Context) (driver.Committed, error) {
	switch {
	case t.done:
		return driver.Committed{}, pgx.ErrTxClosed
	case t.err != nil:
		return driver.Committed{}, t.err
	case t.tx == nil && len(t.pending) == 0:
		t.Rollback(ctx)
		return driver.Committed{}, nil
	}
	// Settings restored right before COMMIT end with it anyway.
	for n := len(t.pending); n > 0 && t.pending[n-1].restore; n-- {
		t.pending = t.pending[:n-1]
	}
	p := &pipe{t: t, commit: true}
	br, err := p.send(ctx, "", nil)
	if err != nil {
		return driver.Committed{}, t.lost(err)
	}
	if err := t.lost(p.end(br, nil)); err != nil {
		return driver.Committed{}, err
	}
	for _, f := range t.afterCommit {
		f()
	}
	t.afterCommit = nil
	return t.committed, nil
}

// lost returns err marked with the driver's sentinels (interpretError),
// and as a lost connection when pgx closed t's connection under the
// statement that failed.
func (t *engineTx) lost(err error) error {
	if err == nil || t.conn == nil {
		return interpretError(err)
	}
	return lostConn(t.conn.Conn(), err)
}

// readPending reads the results of the pending statements sent at the head
// of br. A failure makes the transaction unable to commit.
func (t *engineTx) readPending(br pgx.BatchResults, pending []*pendingStmt) error {
	for _, s := range pending {
		var err error
		if s.read != nil {
			err = s.read(br)
		} else {
			_, err = br.Exec()
		}
		if err != nil {
			what := s.what
			if what == "" {
				what, _, _ = strings.Cut(s.sql, "\n")
			}
			t.err = t.lost(fmt.Errorf("%s: %w", what, err))
			return t.err
		}
	}
	return nil
}

// begin sends BEGIN and the pending statements on their own, for a caller
// that needs the transaction before any operation.
func (t *engineTx) begin(ctx context.Context) error {
	_, err := t.exec(ctx, false).Exec(ctx, "select 1")
	return err
}

// queue adds statements without arguments to those sent ahead of the next
// operation.
func (t *engineTx) queue(sql ...string) {
	for _, s := range sql {
		t.pending = append(t.pending, &pendingStmt{sql: s})
	}
}

// later returns an executor whose statements are queued to go out with t's
// next round trip (the next operation's statement, or Commit), named what
// in their errors. Exec returns at once; QueryRow's Scan records where its
// row goes and returns at once, the row being read when the statement has
// gone out: use the scanned values in a function passed to onCommit.
func (t *engineTx) later(what string) dbsqlc.DBTX { return laterTx{t: t, what: what} }

// onCommit runs f once t has committed, before Commit returns.
func (t *engineTx) onCommit(f func()) { t.afterCommit = append(t.afterCommit, f) }

// exec returns the executor of t's next statement: it sends that statement
// in one round trip with BEGIN (the first time), the pending statements
// and, with commit, COMMIT, and writes the schema into it.
func (t *engineTx) exec(ctx context.Context, commit bool) dbsqlc.DBTX {
	return &pipe{t: t, commit: commit}
}

// execThen is exec with statements without arguments sent right after the
// statement, in the same round trip (a savepoint for a handler).
func (t *engineTx) execThen(then ...string) dbsqlc.DBTX {
	return &pipe{t: t, then: then}
}

// execAround is exec with statements without arguments sent right before
// the statement and right after it, in the same round trip: a planner
// setting and its restore.
func (t *engineTx) execAround(commit bool, before, then []string) dbsqlc.DBTX {
	return &pipe{t: t, before: before, then: then, commit: commit}
}

// ahead returns an executor that queues its statement to go out ahead of
// t's next one, in the same round trip, and returns at once. Its result is
// not read; should it fail, t cannot commit.
func (t *engineTx) ahead() dbsqlc.DBTX { return laterTx{t: t} }

// laterTx is the executor of ahead and later. Query is not supported: a
// queued statement's rows are read after it has gone out, which sqlc's
// generated code for many rows does not allow.
type laterTx struct {
	t       *engineTx
	what    string
	restore bool
}

func (l laterTx) queue(sql string, args []any) (*pendingStmt, error) {
	switch t := l.t; {
	case t.done:
		return nil, pgx.ErrTxClosed
	case t.err != nil:
		return nil, t.err
	}
	st := &pendingStmt{sql: l.t.s.render(sql), args: pgArgs(args), what: l.what, restore: l.restore}
	l.t.pending = append(l.t.pending, st)
	return st, nil
}

// Exec implements dbsqlc.DBTX.
func (l laterTx) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	_, err := l.queue(sql, args)
	return pgconn.CommandTag{}, err
}

// Query implements dbsqlc.DBTX; a queued statement's rows cannot be read.
func (l laterTx) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, errors.New("store: the rows of a queued statement cannot be read")
}

// QueryRow implements dbsqlc.DBTX: the row is scanned once the statement
// has gone out.
func (l laterTx) QueryRow(_ context.Context, sql string, args ...any) pgx.Row {
	st, err := l.queue(sql, args)
	if err != nil {
		return errRow{err}
	}
	return laterRow{st}
}

// laterRow is the row of a queued statement: Scan records the destinations
// and returns at once; they are filled in when the statement's result is
// read.
type laterRow struct{ st *pendingStmt }

func (r laterRow) Scan(dest ...any) error {
	r.st.read = func(br pgx.BatchResults) error { return br.QueryRow().Scan(dest...) }
	return nil
}

// pipe is the executor of one statement of a Tx. It implements dbsqlc.DBTX
// so that the sqlc-generated code runs through it unchanged.
type pipe struct {
	t            *engineTx
	before, then []string
	commit       bool
}

// send sends sql in a batch with what must go with it and returns the batch
// results positioned at sql's result (after the pending statements when sql
// is empty).
func (p *pipe) send(ctx context.Context, sql string, args []any) (pgx.BatchResults, error) {
	t := p.t
	if t.done {
		return nil, pgx.ErrTxClosed
	}
	if t.err != nil {
		return nil, t.err
	}
	b := &pgx.Batch{}
	if t.tx == nil {
		if t.conn == nil {
			conn, err := t.s.pool.Acquire(ctx)
			if err != nil {
				return nil, fmt.Errorf("acquire connection: %w", err)
			}
			t.conn = conn
		}
		b.BeginTx(pgx.TxOptions{})
	}
	pending := t.pending
	t.pending = nil
	for _, s := range pending {
		b.Queue(s.sql, s.args...)
	}
	for _, s := range p.before {
		b.Queue(s)
	}
	if sql != "" {
		b.Queue(t.s.render(sql), pgArgs(args)...)
	}
	for _, s := range p.then {
		b.Queue(s)
	}
	if p.commit {
		b.Queue("commit")
	}
	br := t.conn.SendBatch(ctx, b)
	if t.tx == nil {
		t.tx = br.Tx()
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return nil, fmt.Errorf("begin: %w", err)
		}
	}
	if err := t.readPending(br, pending); err != nil {
		_ = br.Close()
		return nil, err
	}
	for _, s := range p.before {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return nil, fmt.Errorf("%s: %w", s, err)
		}
	}
	return br, nil
}

// end reads the rest of a batch (COMMIT) after the statement's result, and
// closes it. A failed commit, or a statement that failed on its own, leaves
// the transaction to Rollback.
func (p *pipe) end(br pgx.BatchResults, stmtErr error) error {
	err := stmtErr
	for _, s := range p.then {
		if err != nil {
			break
		}
		if _, err = br.Exec(); err != nil {
			err = fmt.Errorf("%s: %w", s, err)
		}
	}
	if p.commit && err == nil {
		var tag pgconn.CommandTag
		tag, err = br.Exec()
		if err == nil && tag.String() == "ROLLBACK" {
			err = pgx.ErrTxCommitRollback
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if p.commit && err == nil {
		p.t.done = true
		p.t.conn.Release()
		p.t.conn = nil
	}
	return err
}

// Exec implements dbsqlc.DBTX.
func (p *pipe) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	br, err := p.send(ctx, sql, args)
	if err != nil {
		return pgconn.CommandTag{}, p.t.lost(err)
	}
	tag, err := br.Exec()
	return tag, p.t.lost(p.end(br, err))
}

// Query implements dbsqlc.DBTX.
func (p *pipe) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	br, err := p.send(ctx, sql, args)
	if err != nil {
		return nil, p.t.lost(err)
	}
	rows, err := br.Query()
	if err != nil {
		return nil, p.t.lost(p.end(br, err))
	}
	return &pipeRows{Rows: rows, p: p, br: br}, nil
}

// QueryRow implements dbsqlc.DBTX.
func (p *pipe) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := p.Query(ctx, sql, args...)
	if err != nil {
		return errRow{err}
	}
	return &pipeRow{rows: rows.(*pipeRows)}
}

// pipeRows are the rows of a pipe's statement; closing them reads the rest
// of the batch.
type pipeRows struct {
	pgx.Rows
	p      *pipe
	br     pgx.BatchResults
	closed bool
	err    error
}

func (r *pipeRows) Close() {
	if r.closed {
		return
	}
	r.closed = true
	r.Rows.Close()
	r.err = r.p.t.lost(r.p.end(r.br, r.Rows.Err()))
}

func (r *pipeRows) Err() error {
	if !r.closed {
		return r.p.t.lost(r.Rows.Err())
	}
	return r.err
}

// pipeRow is the single row of a pipe's statement.
type pipeRow struct{ rows *pipeRows }

func (r *pipeRow) Scan(dest ...any) error {
	defer r.rows.Close()
	if !r.rows.Next() {
		r.rows.Close()
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		r.rows.Close()
		if cerr := r.rows.Err(); cerr != nil && !errors.Is(cerr, err) {
			return errors.Join(err, cerr)
		}
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
