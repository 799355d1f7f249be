package cli_test

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/cmd/sagabox/internal/cli"
	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
)

// TestUIServesTheConsoleReadOnly runs `sagabox ui` on a migrated schema: it
// prints its address, serves the pages, refuses a POST without
// --allow-actions, and exits 0 when interrupted.
func TestUIServesTheConsoleReadOnly(t *testing.T) {
	t.Parallel()
	db := dbtest.Store(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr testkit.Buffer
	done := make(chan int, 1)
	go func() {
		done <- cli.Run(ctx, []string{"--database-url", dbtest.URL(), "--schema", db.Store.Schema(), "ui", "--addr", "127.0.0.1:0"}, &stdout, &stderr)
	}()
	addrRe := regexp.MustCompile(`on (http://[0-9.:]+)/ \(read-only\)`)
	var base string
	deadline := time.Now().Add(60 * time.Second)
	for base == "" {
		if m := addrRe.FindStringSubmatch(stdout.String()); m != nil {
			base = m[1]
			break
		}
		select {
		case code := <-done:
			t.Fatalf("sagabox ui exited %d: %s", code, stderr.String())
		case <-time.After(50 * time.Millisecond):
		}
		require.True(t, time.Now().Before(deadline), "sagabox ui printed no address: %s", stderr.String())
	}
	c := &http.Client{Timeout: 30 * time.Second}
	for _, page := range []string{"/sagas", "/outbox", "/requests", "/static/console.css"} {
		resp, err := c.Get(base + page)
		require.NoError(t, err)
		_, err = io.Copy(io.Discard, resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusOK, resp.StatusCode, page)
	}
	resp, err := c.Post(base+"/sagas/01a2296a-f375-7cd0-96cd-028916168da3/abort", "application/x-www-form-urlencoded", strings.NewReader("reason=x"))
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	cancel()
	require.Equal(t, cli.ExitOK, <-done, stderr.String())
}
