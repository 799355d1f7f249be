package faulttest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// killer terminates, every so often, one database connection of the run's
// clients that is inside a transaction: a delivery, a reply or a sweep
// rolled back wherever it was, as when the connection breaks or the server
// ends the session.
func (r *run[In]) killer(ctx context.Context, pool *pgxpool.Pool, appPrefix string) {
	if r.faults.KillEvery <= 0 {
		return
	}
	for {
		t := time.NewTimer(r.inj.duration(2 * r.faults.KillEvery))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if err := r.killOne(ctx, pool, appPrefix); err != nil && ctx.Err() == nil {
			r.s.Logger.Warn("faulttest: kill a connection", "err", err)
		}
	}
}

func (r *run[In]) killOne(ctx context.Context, pool *pgxpool.Pool, appPrefix string) error {
	rows, err := pool.Query(ctx, `SELECT pid FROM pg_stat_activity
		WHERE starts_with(application_name, $1) AND state = 'idle in transaction' AND pid <> pg_backend_pid()`, appPrefix)
	if err != nil {
		return fmt.Errorf("list connections: %w", err)
	}
	var pids []int32
	for rows.Next() {
		var pid int32
		if err := rows.Scan(&pid); err != nil {
			rows.Close()
			return fmt.Errorf("list connections: %w", err)
		}
		pids = append(pids, pid)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("list connections: %w", err)
	}
	if len(pids) == 0 {
		return nil
	}
	var killed bool
	if err := pool.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, pids[r.inj.intN(len(pids))]).Scan(&killed); err != nil {
		return fmt.Errorf("terminate a connection: %w", err)
	}
	if killed {
		r.inj.count(FaultKill)
	}
	return nil
}
