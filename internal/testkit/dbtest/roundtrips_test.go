package dbtest_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit/dbtest"
)

// Transactions made one after the other come back in that order, and so do
// their round trips, even when the pool gave each a different connection
// (the recorder keeps them per connection, in a map whose order is random).
func TestRoundTripsKeepTheOrderAcrossConnections(t *testing.T) {
	t.Parallel()
	var rts dbtest.RoundTrips
	pool := dbtest.PoolWith(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = &rts })
	ctx := context.Background()
	const n = 8
	// Hold n connections at once, so that the transactions below run on
	// n different ones.
	conns := make([]*pgxpool.Conn, n)
	for i := range conns {
		c, err := pool.Acquire(ctx)
		require.NoError(t, err)
		conns[i] = c
	}
	rts.Start()
	for i, c := range conns {
		tx, err := c.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, fmt.Sprintf("SELECT %d", i))
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
	}
	rts.Stop()
	for _, c := range conns {
		c.Release()
	}
	txs := rts.Transactions()
	require.Len(t, txs, n)
	for i, tx := range txs {
		require.True(t, tx.Has(fmt.Sprintf("SELECT %d", i)), "transaction %d: %v", i, tx.Statements())
	}
	var selects []string
	for _, rt := range rts.All() {
		for _, s := range rt.SQL {
			if len(s) > 7 && s[:7] == "SELECT " {
				selects = append(selects, s)
			}
		}
	}
	require.Len(t, selects, n)
	for i, s := range selects {
		require.Equal(t, fmt.Sprintf("SELECT %d", i), s)
	}
}
