package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sagabox/sagabox/store/internal/dbsqlc"
)

// writePlan keeps the saga-row update of a transition write (SagaWrite)
// off sequential scans, and stashes the setting it replaces for
// writePlanEnd to restore; both are local to the transaction.
//
// The update finds its sagas by primary key among the ids of an array
// parameter. Its generic plan, which a connection builds once and keeps,
// is chosen by the table's size at that moment: on a table never analysed
// (a fresh deployment, autovacuum behind a burst) PostgreSQL assumes ten
// pages and plans a scan of every saga. The connection keeps that plan
// while the table grows: in a three-step saga bench at 196 sagas/s, the
// write read 103 buffers per call and took 0.5–1 ms, against 3 buffers by
// primary key. sqlc cannot express the lookup by tuple id that would make
// any plan a primary-key probe, so the planner is told instead.
//
// The write decides the write-time lease in the same statement. The lease's
// switch reaches it through an InitPlan (SELECT @lease_seconds), which no
// plan folds: a custom plan costs what the generic plan costs, and the plan
// cache keeps the generic one. Folded, a custom plan without a lease dropped
// the lease's probe, looked cheaper, and the plan cache planned every write
// anew: about 1 ms of PostgreSQL's time per transition in a three-step saga
// bench at 60 sagas/s, three times the execution
// (TestTransitionWriteKeepsItsGenericPlan).
const (
	writePlan = "select set_config('sagabox.enable_seqscan', current_setting('enable_seqscan'), true), " +
		"set_config('enable_seqscan', 'off', true)"
	writePlanEnd = "select set_config('enable_seqscan', current_setting('sagabox.enable_seqscan'), true)"
)

// plannedTx runs single-row statements in a caller's transaction in one
// round trip with writePlan before them and writePlanEnd after, so that the
// setting never outlives the statement in a transaction that is not ours.
type plannedTx struct {
	tx pgx.Tx
}

var _ dbsqlc.DBTX = plannedTx{}

func (p plannedTx) send(ctx context.Context, sql string, args []any) (pgx.BatchResults, error) {
	b := &pgx.Batch{}
	b.Queue(writePlan)
	b.Queue(sql, args...)
	b.Queue(writePlanEnd)
	br := p.tx.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, fmt.Errorf("planner setting: %w", err)
	}
	return br, nil
}

// end reads writePlanEnd's result and closes br.
func end(br pgx.BatchResults, err error) error {
	if err == nil {
		if _, err = br.Exec(); err != nil {
			err = fmt.Errorf("planner setting: %w", err)
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// Exec implements dbsqlc.DBTX.
func (p plannedTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	br, err := p.send(ctx, sql, args)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	return tag, end(br, err)
}

// errPlannedQuery is what plannedTx.Query returns: the restoring statement
// could only be read once the caller has closed the rows, which pgx.Rows
// gives no hook for.
var errPlannedQuery = errors.New("store: a statement run under a planner setting in a caller's transaction must return at most one row")

// Query implements dbsqlc.DBTX for no statement: see errPlannedQuery.
func (plannedTx) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, errPlannedQuery
}

// QueryRow implements dbsqlc.DBTX.
func (p plannedTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	br, err := p.send(ctx, sql, args)
	if err != nil {
		return errRow{err}
	}
	return plannedRow{br: br, row: br.QueryRow()}
}

// plannedRow is the row of a plannedTx statement: Scan also reads the
// restoring statement's result.
type plannedRow struct {
	br  pgx.BatchResults
	row pgx.Row
}

func (r plannedRow) Scan(dest ...any) error { return end(r.br, r.row.Scan(dest...)) }
