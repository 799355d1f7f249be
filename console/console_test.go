package console_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/console"
)

// client is an HTTP client with cookies that does not follow redirects.
func client(t *testing.T) *http.Client {
	t.Helper()
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }, Timeout: 30 * time.Second}
}

func get(t *testing.T, c *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := c.Get(u)
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return resp.StatusCode, string(b)
}

// post posts form and returns the status, the body and the redirect's
// location.
func post(t *testing.T, c *http.Client, u string, form url.Values, header http.Header) (code int, body, location string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, u, strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return resp.StatusCode, string(b), resp.Header.Get("Location")
}

var tokenRe = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// pendingRequests counts the operator requests recorded in the world.
func (w *world) pendingRequests() int {
	w.t.Helper()
	ops, err := w.orch.OperationListPending(context.Background(), 0, 100)
	require.NoError(w.t, err)
	return len(ops)
}

// TestConsoleActionsNeedAllowActionsAndCSRF checks the console's guard on
// every action: a read-only console refuses a POST with 403 and records
// nothing; a console with actions refuses a POST without the CSRF cookie,
// with a wrong token or from another origin, and without a reason; a
// same-origin POST with the page's token records the request with the
// actor and the reason.
func TestConsoleActionsNeedAllowActionsAndCSRF(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	orch := w.orchestrator(nil)
	st := w.start(orch, holding(), Order{ID: "o-1"}, "order-1")
	sagaURL := func(base string) string { return base + "/sagas/" + st.ID.String() }

	ro, err := console.New(console.Config{Pool: w.pool, Schema: w.orch.Store.Schema()})
	require.NoError(t, err)
	roSrv := httptest.NewServer(ro)
	t.Cleanup(roSrv.Close)
	c := client(t)
	code, body := get(t, c, sagaURL(roSrv.URL))
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "read-only")
	require.NotContains(t, body, `name="csrf"`, "a read-only console offers no action")
	code, body, _ = post(t, c, sagaURL(roSrv.URL)+"/abort", url.Values{"reason": {"test"}}, nil)
	require.Equal(t, http.StatusForbidden, code, body)
	require.Contains(t, body, "read-only")
	require.Zero(t, w.pendingRequests(), "a refused POST records nothing")

	rw, err := console.New(console.Config{
		Pool: w.pool, Schema: w.orch.Store.Schema(), MessagingSchemas: []string{w.svc.Store.Schema()},
		AllowActions: true, BasePath: "/console", ActionWait: 100 * time.Millisecond,
		Actor: func(*http.Request) string { return "alice" },
	})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/console/", rw)
	rwSrv := httptest.NewServer(mux)
	t.Cleanup(rwSrv.Close)
	base := rwSrv.URL + "/console"

	// No cookie, no token.
	code, body, _ = post(t, client(t), sagaURL(base)+"/abort", url.Values{"reason": {"test"}}, nil)
	require.Equal(t, http.StatusForbidden, code, body)
	require.Contains(t, body, "CSRF")

	// The page sets the cookie and carries the token.
	c = client(t)
	code, body = get(t, c, sagaURL(base))
	require.Equal(t, http.StatusOK, code, body)
	m := tokenRe.FindStringSubmatch(body)
	require.NotNil(t, m, "the page of a running saga has action forms")
	token := m[1]

	for name, tc := range map[string]struct {
		form   url.Values
		header http.Header
		code   int
	}{
		"wrong token":  {url.Values{"reason": {"test"}, "csrf": {strings.Repeat("ab", 32)}}, nil, http.StatusForbidden},
		"no token":     {url.Values{"reason": {"test"}}, nil, http.StatusForbidden},
		"cross-site":   {url.Values{"reason": {"test"}, "csrf": {token}}, http.Header{"Sec-Fetch-Site": {"cross-site"}}, http.StatusForbidden},
		"other origin": {url.Values{"reason": {"test"}, "csrf": {token}}, http.Header{"Origin": {"https://evil.example"}}, http.StatusForbidden},
		"no reason":    {url.Values{"reason": {"  "}, "csrf": {token}}, nil, http.StatusBadRequest},
	} {
		code, body, _ := post(t, c, sagaURL(base)+"/abort", tc.form, tc.header)
		require.Equal(t, tc.code, code, "%s: %s", name, body)
	}
	require.Zero(t, w.pendingRequests(), "refused POSTs record nothing")

	code, body, location := post(t, c, sagaURL(base)+"/abort", url.Values{"reason": {"customer called"}, "csrf": {token}},
		http.Header{"Origin": {rwSrv.URL}, "Sec-Fetch-Site": {"same-origin"}})
	require.Equal(t, http.StatusSeeOther, code, body)
	require.True(t, strings.HasPrefix(location, "/console/sagas/"+st.ID.String()), location)
	ops, err := w.orch.OperationListPending(context.Background(), 0, 10)
	require.NoError(t, err)
	require.Len(t, ops, 1)
	require.Equal(t, []string{st.ID.String(), "abort", "alice", "customer called"}, []string{ops[0].SagaID.String(), ops[0].Action, ops[0].Actor, ops[0].Reason})

	// With no orchestrator running, the request stays pending, and shows.
	code, body = get(t, c, rwSrv.URL+location)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "pending")
	code, body = get(t, c, base+"/requests")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "customer called")

	// A completed saga's abort is refused at once.
	code, body, _ = post(t, c, base+"/sagas/00000000-0000-0000-0000-000000000001/abort", url.Values{"reason": {"x"}, "csrf": {token}}, nil)
	require.Equal(t, http.StatusNotFound, code, body)

	// A dead outbox row shows with its reason, and replays.
	svc := pgx.Identifier{w.svc.Store.Schema()}.Sanitize()
	var row int64
	require.NoError(t, w.pool.QueryRow(context.Background(), `INSERT INTO `+svc+`.sagabox_outbox
		(message_id, ordering_key, kind, type, routing_key, payload, published_at, dead_at, last_error, publish_attempts)
		VALUES (gen_random_uuid(), 'k', 'event', 'shop.noticed', 'nowhere', '\x7b7d', now(), now(), 'unroutable: no queue for nowhere', 5)
		RETURNING id`).Scan(&row))
	code, body = get(t, c, base+"/outbox")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "unroutable: no queue for nowhere")
	replay := fmt.Sprintf("%s/outbox/%s/dead/%d/replay", base, w.svc.Store.Schema(), row)
	code, body, _ = post(t, c, replay, url.Values{"reason": {"queue declared now"}}, nil)
	require.Equal(t, http.StatusForbidden, code, "replay needs the token too: %s", body)
	code, body, location = post(t, c, replay, url.Values{"reason": {"queue declared now"}, "csrf": {token}}, nil)
	require.Equal(t, http.StatusSeeOther, code, body)
	require.Contains(t, location, "/console/outbox")
	var dead bool
	require.NoError(t, w.pool.QueryRow(context.Background(), `SELECT dead_at IS NOT NULL FROM `+svc+`.sagabox_outbox WHERE id = $1`, row).Scan(&dead))
	require.False(t, dead, "the replayed row is unpublished again")
	code, body, _ = post(t, c, replay, url.Values{"reason": {"again"}, "csrf": {token}}, nil)
	require.Equal(t, http.StatusNotFound, code, body)

	// Restart needs a step, and a failed or compensated saga; terminate
	// applies to a running one.
	code, body, _ = post(t, c, sagaURL(base)+"/restart", url.Values{"reason": {"x"}, "csrf": {token}}, nil)
	require.Equal(t, http.StatusBadRequest, code, body)
	require.Contains(t, body, "choose the step")
	code, body, _ = post(t, c, sagaURL(base)+"/restart", url.Values{"reason": {"x"}, "from": {"hold"}, "csrf": {token}}, nil)
	require.Equal(t, http.StatusConflict, code, body)
	require.Contains(t, body, "only a failed or compensated saga can be restarted")
	code, body, _ = post(t, c, sagaURL(base)+"/terminate", url.Values{"reason": {"fraud"}, "csrf": {token}}, nil)
	require.Equal(t, http.StatusSeeOther, code, body)
	ops, err = w.orch.OperationListPending(context.Background(), 0, 10)
	require.NoError(t, err)
	require.Equal(t, "terminate", ops[len(ops)-1].Action)
}
