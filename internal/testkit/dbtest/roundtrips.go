package dbtest

import (
	"context"
	"slices"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
)

// RoundTrips is a pgx tracer that records every round trip a pool's
// connections make to PostgreSQL: each Exec, Query and QueryRow, each
// SendBatch (however many statements it carries) and each CopyFrom.
// Preparing a statement for pgx's statement cache is not counted: it happens
// once per connection and statement, not per unit of work. Install it as
// pgxpool.Config.ConnConfig.Tracer before the pool is created.
type RoundTrips struct {
	mu     sync.Mutex
	on     bool
	seq    int
	byConn map[*pgx.Conn][]RoundTrip
}

// RoundTrip is one request and its response: the statements it carried, in
// order.
type RoundTrip struct {
	SQL []string
	// seq orders the round trips of every connection as they were made.
	seq int
}

// Transaction is the round trips of one explicit transaction on one
// connection, from the one that carried BEGIN to the one that carried
// COMMIT or ROLLBACK.
type Transaction struct {
	RoundTrips []RoundTrip
}

// Statements returns the statements of every round trip of t, in order.
func (t Transaction) Statements() []string {
	var out []string
	for _, rt := range t.RoundTrips {
		out = append(out, rt.SQL...)
	}
	return out
}

// Has reports whether one of t's statements is the sqlc query called name
// (its "-- name: <name>" line) or starts with name.
func (t Transaction) Has(name string) bool {
	for _, s := range t.Statements() {
		if strings.HasPrefix(s, "-- name: "+name+" ") || strings.HasPrefix(strings.ToLower(s), strings.ToLower(name)) {
			return true
		}
	}
	return false
}

// Start starts (or restarts) recording, forgetting what was recorded before.
func (r *RoundTrips) Start() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.on, r.byConn = true, map[*pgx.Conn][]RoundTrip{}
}

// Stop stops recording.
func (r *RoundTrips) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.on = false
}

func (r *RoundTrips) record(conn *pgx.Conn, sql ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.on {
		return
	}
	for i := range sql {
		sql[i] = strings.TrimSpace(sql[i])
	}
	r.seq++
	r.byConn[conn] = append(r.byConn[conn], RoundTrip{SQL: sql, seq: r.seq})
}

// All returns every round trip recorded, in the order they were made.
func (r *RoundTrips) All() []RoundTrip {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []RoundTrip
	for _, rts := range r.byConn {
		out = append(out, rts...)
	}
	slices.SortFunc(out, func(a, b RoundTrip) int { return a.seq - b.seq })
	return out
}

// Count returns how many of the statements recorded are the generated
// query name (its "-- name: " header).
func (r *RoundTrips) Count(name string) int {
	n := 0
	for _, rt := range r.All() {
		for _, s := range rt.SQL {
			if strings.HasPrefix(s, "-- name: "+name+" ") {
				n++
			}
		}
	}
	return n
}

// Transactions returns the explicit transactions recorded, in the order
// they began, whichever connections carried them. Round trips outside a
// transaction (autocommit statements) are left out.
func (r *RoundTrips) Transactions() []Transaction {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Transaction
	for _, rts := range r.byConn {
		var cur *Transaction
		for _, rt := range rts {
			for _, s := range rt.SQL {
				if cur == nil && isTxControl(s, "begin") {
					cur = &Transaction{}
				}
			}
			if cur == nil {
				continue
			}
			cur.RoundTrips = append(cur.RoundTrips, rt)
			for _, s := range rt.SQL {
				if isTxControl(s, "commit") || (isTxControl(s, "rollback") && !isTxControl(s, "rollback to")) {
					out = append(out, *cur)
					cur = nil
					break
				}
			}
		}
	}
	// The connections are a map: without this, two transactions a test
	// made one after the other on two connections came back in either
	// order.
	slices.SortFunc(out, func(a, b Transaction) int { return a.RoundTrips[0].seq - b.RoundTrips[0].seq })
	return out
}

func isTxControl(sql, verb string) bool {
	s := strings.ToLower(strings.TrimSpace(sql))
	return s == verb || strings.HasPrefix(s, verb+" ") || strings.HasPrefix(s, verb+";")
}

// TraceQueryStart implements pgx.QueryTracer.
func (r *RoundTrips) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	r.record(conn, data.SQL)
	return ctx
}

// TraceQueryEnd implements pgx.QueryTracer.
func (r *RoundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceBatchStart implements pgx.BatchTracer.
func (r *RoundTrips) TraceBatchStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	sql := make([]string, 0, data.Batch.Len())
	for _, q := range data.Batch.QueuedQueries {
		sql = append(sql, q.SQL)
	}
	r.record(conn, sql...)
	return ctx
}

// TraceBatchQuery implements pgx.BatchTracer.
func (r *RoundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

// TraceBatchEnd implements pgx.BatchTracer.
func (r *RoundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// TraceCopyFromStart implements pgx.CopyFromTracer.
func (r *RoundTrips) TraceCopyFromStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceCopyFromStartData) context.Context {
	r.record(conn, "COPY "+data.TableName.Sanitize())
	return ctx
}

// TraceCopyFromEnd implements pgx.CopyFromTracer.
func (r *RoundTrips) TraceCopyFromEnd(context.Context, *pgx.Conn, pgx.TraceCopyFromEndData) {}
