package console_test

import (
	"context"
	"fmt"
	"html"
	"net/http"
	"net/http/httptest"
	"regexp"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/console"
)

var (
	deadRowRe    = regexp.MustCompile(`class="dead-row" data-row="(\d+)"`)
	deadLetterRe = regexp.MustCompile(`<tr class="dead-letter">\s*<td><code>([0-9a-f-]+)</code>`)
	deadNextRe   = regexp.MustCompile(`href="([^"]+)" class="dead-next"`)
	inboxNextRe  = regexp.MustCompile(`href="([^"]+)" class="inbox-next"`)
)

// The outbox page lists dead outbox rows and dead-lettered deliveries a
// page at a time, most recent first, and links to the next page of each
// until the last: following the links shows every entry once, in order,
// also when entries share a timestamp.
func TestConsoleOutboxPages(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	const pageSize, deadRows, letters = 3, 7, 4
	svc := pgx.Identifier{w.svc.Store.Schema()}.Sanitize()
	ctx := context.Background()
	// Rows 1–3 share their dead_at, as do the letters: the id (the message
	// id) breaks the tie.
	_, err := w.pool.Exec(ctx, `INSERT INTO `+svc+`.sagabox_outbox
		(message_id, ordering_key, kind, type, routing_key, payload, published_at, dead_at, last_error, publish_attempts)
		SELECT gen_random_uuid(), 'k', 'event', 'shop.noticed', 'nowhere', '\x7b7d', now(),
		       '2026-01-01T00:00:00Z'::timestamptz + make_interval(secs => greatest(i, 3)), 'unroutable', 5
		FROM generate_series(1, $1) AS i ORDER BY i`, deadRows)
	require.NoError(t, err)
	_, err = w.pool.Exec(ctx, `INSERT INTO `+svc+`.sagabox_inbox_attempt
		(message_id, type, attempts, last_error, dead_lettered_at, updated_at)
		SELECT gen_random_uuid(), 'shop.do', 5, 'handler failed', '2026-01-01Z', '2026-01-01Z'
		FROM generate_series(1, $1)`, letters)
	require.NoError(t, err)
	var wantRows, wantLetters []string
	rows, err := w.pool.Query(ctx, `SELECT id::text FROM `+svc+`.sagabox_outbox ORDER BY dead_at DESC, id DESC`)
	require.NoError(t, err)
	wantRows, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	rows, err = w.pool.Query(ctx, `SELECT message_id::text FROM `+svc+`.sagabox_inbox_attempt ORDER BY message_id DESC`)
	require.NoError(t, err)
	wantLetters, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)

	h, err := console.New(console.Config{Pool: w.pool, Schema: w.orch.Store.Schema(), MessagingSchemas: []string{w.svc.Store.Schema()}, PageSize: pageSize})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c := client(t)

	// walk follows next links from the first page and returns the entries
	// each page listed, and how many pages there were.
	walk := func(entry, next *regexp.Regexp) (seen []string, pages int) {
		u := srv.URL + "/outbox"
		for u != "" {
			code, body := get(t, c, u)
			require.Equal(t, http.StatusOK, code, body)
			pages++
			for _, m := range entry.FindAllStringSubmatch(body, -1) {
				seen = append(seen, m[1])
			}
			u = ""
			if m := next.FindStringSubmatch(body); m != nil {
				u = srv.URL + html.UnescapeString(m[1])
				if pages > 1 {
					require.NotContains(t, body, fmt.Sprintf(`data-schema="%s"`, w.orch.Store.Schema()), "a next page shows its schema alone")
				}
			}
			require.LessOrEqual(t, pages, 10, "the pages end")
		}
		return seen, pages
	}
	seen, pages := walk(deadRowRe, deadNextRe)
	require.Equal(t, wantRows, seen, "every dead row once, most recent first")
	require.Equal(t, 3, pages)
	seen, pages = walk(deadLetterRe, inboxNextRe)
	require.Equal(t, wantLetters, seen, "every dead-lettered delivery once, most recent first")
	require.Equal(t, 2, pages)

	for _, q := range []string{
		"?dead_after=1_1", // no schema
		"?schema=nosuch",  // not one the console shows
		"?schema=" + w.svc.Store.Schema() + "&dead_after=x", // not a cursor
		"?schema=" + w.svc.Store.Schema() + "&inbox_after=1_not-a-uuid",
	} {
		code, body := get(t, c, srv.URL+"/outbox"+q)
		require.Equal(t, http.StatusBadRequest, code, "%s: %s", q, body)
	}
}

// Sagas waiting past their deadline for a command still in the outbox get
// a notice on the sagas and outbox pages, and the outbox page lists the
// commands waiting, by type, with the relay's last error.
func TestConsoleNoticesSagasWaitingForUnpublishedCommands(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	h, err := console.New(console.Config{Pool: w.pool, Schema: w.orch.Store.Schema(), MessagingSchemas: []string{w.svc.Store.Schema()}})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c := client(t)
	for _, page := range []string{"/sagas", "/outbox"} {
		code, body := get(t, c, srv.URL+page)
		require.Equal(t, http.StatusOK, code, body)
		require.NotContains(t, body, `id="held"`, "nothing waits: no notice on %s", page)
	}

	// Two sagas have waited ten minutes for loyalty.award, which no queue
	// takes; the relay recorded why.
	orch := pgx.Identifier{w.orch.Store.Schema()}.Sanitize()
	ctx := context.Background()
	_, err = w.pool.Exec(ctx, `
		WITH s AS (
			INSERT INTO `+orch+`.sagabox_saga (id, saga_type, version, status, data, steps, phase, current_step, created_at, updated_at)
			SELECT gen_random_uuid(), 'checkout', 1, 'running', '{}', '[]', 'action', 0, now() - interval '10 minutes', now() - interval '10 minutes'
			FROM generate_series(1, 2)
			RETURNING id
		)
		INSERT INTO `+orch+`.sagabox_outbox (message_id, ordering_key, kind, type, routing_key, saga_id, payload, created_at, publish_attempts, last_error)
		SELECT gen_random_uuid(), s.id::text, 'command', 'loyalty.award', 'loyalty.award', s.id, '\x7b7d', now() - interval '10 minutes', 40,
		       'rabbitmq: message unroutable (no queue is bound for it)'
		FROM s`)
	require.NoError(t, err)
	for _, page := range []string{"/sagas", "/outbox"} {
		code, body := get(t, c, srv.URL+page)
		require.Equal(t, http.StatusOK, code, body)
		require.Contains(t, body, `id="held"`, "the notice on %s", page)
		require.Contains(t, body, `<span class="held" data-type="checkout">2 <code>checkout</code></span>`)
		require.Contains(t, body, "sagabox doctor")
	}
	_, body := get(t, c, srv.URL+"/outbox")
	m := regexp.MustCompile(`(?s)<tr class="waiting-type" data-type="loyalty.award">(.*?)</tr>`).FindStringSubmatch(body)
	require.NotNil(t, m, body)
	require.Contains(t, m[1], "<td>command</td><td>2</td>")
	require.Contains(t, m[1], "<td>40</td>")
	require.Contains(t, m[1], "message unroutable")
}
