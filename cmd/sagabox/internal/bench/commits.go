package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sagabox/sagabox/participant"
)

// rawCommits measures single-row outbox insert commits from writers, each
// through c's Publish (c does not run): the relay bench's database
// ceiling.
func rawCommits(ctx context.Context, pool *pgxpool.Pool, c *participant.Client, schema string, writers int, d time.Duration) (float64, error) {
	var mu sync.Mutex
	commits := 0
	cctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			for cctx.Err() == nil {
				if err := pgx.BeginFunc(cctx, pool, func(tx pgx.Tx) error {
					return c.Publish(cctx, tx, benchMessage(0))
				}); err == nil {
					mu.Lock()
					commits++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	_, err := pool.Exec(ctx, fmt.Sprintf("TRUNCATE %s.sagabox_outbox", pgx.Identifier{schema}.Sanitize()))
	return float64(commits) / d.Seconds(), err
}
