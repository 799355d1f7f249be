package console_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/console"
	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/transport"
)

// userTab returns a tab of its own in a new browser context of tab's
// browser: its own cookies and its own HTTP credentials, as another
// person's browser would have.
func userTab(t *testing.T, tab context.Context) context.Context {
	t.Helper()
	ctx, cancel := chromedp.NewContext(tab, chromedp.WithNewBrowserContext())
	t.Cleanup(cancel)
	_, err := chromedp.Call(ctx, page.SetBypassCSP, page.SetBypassCSPParams{Enabled: true})
	require.NoError(t, err, "open a tab")
	return ctx
}

// signIn signs tab in to the console at base as user: Chromium answers the
// console's basic-auth challenge with the credentials of the URL and keeps
// them for the origin; the tab then goes to base, whose documents have no
// credentials in their URL (a page whose URL has them cannot fetch).
func signIn(t *testing.T, tab context.Context, base, user, password string) {
	t.Helper()
	u, err := url.Parse(base + "/sagas")
	require.NoError(t, err)
	u.User = url.UserPassword(user, password)
	do(t, tab, chromedp.Navigate(u.String()), chromedp.WaitVisible(chromedp.CSS("#sagas")))
	do(t, tab, chromedp.Navigate(base+"/sagas"), chromedp.WaitVisible(chromedp.CSS("#sagas")))
}

// fetchStatus fetches path from the tab's page with init (a JavaScript
// object literal) and returns the status.
func fetchStatus(t *testing.T, tab context.Context, path, init string) int {
	t.Helper()
	return eval[int](t, tab, `fetch(`+quote(path)+`, `+init+`).then(r => r.status)`, chromedp.EvalAwaitPromise)
}

// fetchText fetches path from the tab's page with init and returns the
// status and the body's text.
func fetchText(t *testing.T, tab context.Context, path, init string) (int, string) {
	t.Helper()
	res := eval[[]any](t, tab, `fetch(`+quote(path)+`, `+init+`).then(async r => [r.status, await r.text()])`, chromedp.EvalAwaitPromise)
	require.Len(t, res, 2)
	return int(res[0].(float64)), res[1].(string)
}

// forgePost is the init of a fetch that POSTs an action's form with a
// valid CSRF token (the page's cookie is set to its nonce first).
func forgePost(t *testing.T, tab context.Context, base string) string {
	t.Helper()
	nonce, token := forgedCSRF()
	_, err := chromedp.Call(tab, network.SetCookie, network.SetCookieParams{Name: csrfCookie, Value: nonce, URL: base + "/", HTTPOnly: new(true),
		SameSite: network.CookieSameSiteStrict})
	require.NoError(t, err)
	return `{method: 'POST', body: new URLSearchParams({reason: 'sneaky', csrf: '` + token + `'})}`
}

// authProxy is a stand-in for an authenticating proxy (oauth2-proxy): it
// forwards every request to target from proxyAddr, with the identity
// headers it was given in place of whatever the browser sent (none when
// email is empty: a route the proxy lets through unauthenticated).
func authProxy(t *testing.T, target, email, groups string) *httptest.Server {
	t.Helper()
	to, err := url.Parse(target)
	require.NoError(t, err)
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(proxyAddr)}, Timeout: 10 * time.Second}
	tr := &http.Transport{DialContext: dialer.DialContext}
	rp := &httputil.ReverseProxy{
		Transport: tr,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(to)
			pr.Out.Host = pr.In.Host
			pr.Out.Header.Del("X-Forwarded-Email")
			pr.Out.Header.Del("X-Forwarded-Groups")
			if email != "" {
				pr.Out.Header.Set("X-Forwarded-Email", email)
				pr.Out.Header.Set("X-Forwarded-Groups", groups)
			}
		},
	}
	srv := httptest.NewServer(rp)
	t.Cleanup(func() {
		srv.Close()
		tr.CloseIdleConnections()
	})
	return srv
}

// opOf returns the operator request whose id the tab's URL carries (the
// console redirects there after an action).
func opOf(t *testing.T, tab context.Context, orch *orchestrator.Client) *orchestrator.Request {
	t.Helper()
	id, err := strconv.ParseInt(eval[string](t, tab, `new URLSearchParams(location.search).get('op') || ''`), 10, 64)
	require.NoError(t, err, "the request's id in the URL")
	op, err := orch.GetRequest(context.Background(), id)
	require.NoError(t, err)
	return op
}

// TestConsoleAuthInBrowser drives consoles that know who is acting in
// headless Chromium, against real sagas on PostgreSQL and RabbitMQ. With
// basic auth against an htpasswd file, and behind an authenticating proxy
// that names the user in X-Forwarded-Email (believed from the proxy's
// address only): an unauthenticated browser gets 401; a viewer sees no
// action and a POST of theirs with a valid CSRF token gets 403, recording
// nothing; an operator's action is applied, and the saga's history and the
// request carry the operator's identity; the identity header sent from an
// address that is not the proxy's gets 401.
func TestConsoleAuthInBrowser(t *testing.T) {
	t.Parallel()
	tab := browser(t)
	w := newWorld(t)
	broker := w.broker()
	declare, cancel := context.WithTimeout(context.Background(), amqptest.Timeout)
	defer cancel()
	require.NoError(t, broker.Declare(declare, transport.QueueSpec{Name: "blackhole", Commands: []string{Hold.Name()}}))
	orch := w.orchestrator(broker)
	testkit.Run(t, orch.Run)
	testkit.Run(t, w.participant(broker).Run)
	held := map[string]*orchestrator.Started{}
	for _, name := range []string{"basic", "proxy", "untouched"} {
		held[name] = w.start(orch, holding(), Order{ID: name}, "order-"+name)
	}
	for _, st := range held {
		testkit.WaitFor(t, 60*time.Second, "saga "+st.ID.String()+" to wait on its hold step", func() bool {
			s, err := orch.Get(context.Background(), st.ID)
			require.NoError(t, err)
			return s.CurrentStep == 1
		})
	}
	sagaPath := func(name string) string { return "/sagas/" + held[name].ID.String() }
	schema := w.orch.Store.Schema()

	basic, err := console.New(console.Config{
		Pool: w.pool, Schema: schema, AllowActions: true, ActionWait: 30 * time.Second, Secret: csrfSecret,
		Auth: console.AuthConfig{HtpasswdFile: htpasswdFile(t)},
	})
	require.NoError(t, err)
	basicSrv := httptest.NewServer(basic)
	t.Cleanup(basicSrv.Close)

	proxied, err := console.New(console.Config{
		Pool: w.pool, Schema: schema, AllowActions: true, ActionWait: 30 * time.Second, Secret: csrfSecret,
		Auth: console.AuthConfig{
			ProxyHeader: "X-Forwarded-Email", ProxyGroupsHeader: "X-Forwarded-Groups", TrustedProxies: []string{proxyAddr},
			GroupRoles: map[string]console.Role{"sre": console.RoleOperator},
		},
	})
	require.NoError(t, err)
	consoleSrv := httptest.NewServer(proxied)
	t.Cleanup(consoleSrv.Close)
	olgaProxy := authProxy(t, consoleSrv.URL, "olga@example.com", "dev,sre")
	veraProxy := authProxy(t, consoleSrv.URL, "vera@example.com", "dev")
	openProxy := authProxy(t, consoleSrv.URL, "", "")

	t.Run("basic auth: an unauthenticated browser gets 401", func(t *testing.T) {
		anon := userTab(t, tab)
		ctx, cancel := context.WithTimeout(anon, 60*time.Second)
		defer cancel()
		err := chromedp.Do(ctx, chromedp.Navigate(basicSrv.URL+sagaPath("untouched")))
		require.ErrorContains(t, err, "ERR_INVALID_AUTH_CREDENTIALS", "the console challenged, the browser had no credentials")

		// A signed-in browser's requests without its credentials.
		tab := userTab(t, tab)
		signIn(t, tab, basicSrv.URL, viewerUser, viewerPassword)
		for _, path := range []string{"/sagas", sagaPath("untouched"), "/outbox", "/static/console.css"} {
			require.Equal(t, http.StatusOK, fetchStatus(t, tab, path, `{}`), path)
			require.Equal(t, http.StatusUnauthorized, fetchStatus(t, tab, path, `{credentials: 'omit'}`), path)
		}
		require.Equal(t, http.StatusUnauthorized, fetchStatus(t, tab, sagaPath("untouched")+"/abort",
			`{method: 'POST', credentials: 'omit', body: new URLSearchParams({reason: 'x'})}`))
	})

	t.Run("basic auth: a viewer sees no action and is refused 403", func(t *testing.T) {
		tab := userTab(t, tab)
		signIn(t, tab, basicSrv.URL, viewerUser, viewerPassword)
		do(t, tab, chromedp.Navigate(basicSrv.URL+sagaPath("untouched")), chromedp.WaitVisible(chromedp.CSS("#history")))
		require.Equal(t, []string{"viewer"}, attrs(t, tab, "#who", "data-role"))
		require.Equal(t, "read-only", text(t, tab, "#mode"))
		require.Zero(t, eval[int](t, tab, `document.querySelectorAll('form[method=post], #actions, button').length`), "no action buttons")
		status, body := fetchText(t, tab, sagaPath("untouched")+"/abort", forgePost(t, tab, basicSrv.URL))
		require.Equal(t, http.StatusForbidden, status, body)
		require.Contains(t, body, "vera is a viewer: only an operator may")
		require.Zero(t, w.pendingRequests(), "nothing recorded")
	})

	t.Run("basic auth: an operator's action is recorded under their name", func(t *testing.T) {
		tab := userTab(t, tab)
		signIn(t, tab, basicSrv.URL, operatorUser, operatorPassword)
		do(t, tab, chromedp.Navigate(basicSrv.URL+sagaPath("basic")), chromedp.WaitVisible(chromedp.CSS("#abort-form")))
		require.Equal(t, []string{"operator"}, attrs(t, tab, "#who", "data-role"))
		require.Zero(t, eval[int](t, tab, `document.querySelectorAll('input[name=actor]').length`), "nobody types the actor")
		do(t, tab, chromedp.SendKeys(chromedp.CSS(`#abort-form input[name=reason]`), "customer cancelled by phone"),
			chromedp.Click(chromedp.CSS(`#abort-form button`)))
		waitJS(t, tab, "the outcome of the abort", `!!document.querySelector('#flash')`)
		require.Contains(t, text(t, tab, "#flash"), "abort applied")
		require.Equal(t, []string{operatorUser}, attrs(t, tab, `#history tr.operator[data-event="cancelled"]`, "data-actor"),
			"the saga's history names the operator")
		op := opOf(t, tab, orch)
		require.Equal(t, []string{"abort", operatorUser, "customer cancelled by phone"}, []string{op.Action, op.Actor, op.Reason})
		waitStatus(t, orch, held["basic"], saga.StatusCompensated)
	})

	t.Run("proxy: the identity header from an untrusted address gets 401", func(t *testing.T) {
		tab := userTab(t, tab)
		// Straight to the console, not through the proxy: from 127.0.0.1.
		resp, err := chromedp.Run(tab, chromedp.NavigateResponse(consoleSrv.URL+"/sagas"))
		require.NoError(t, err)
		require.Equal(t, http.StatusUnauthorized, int(resp.Status), "no identity")
		require.Contains(t, text(t, tab, "#error"), "no identity")
		require.Zero(t, eval[int](t, tab, `document.querySelectorAll('#sagas').length`))
		status, body := fetchText(t, tab, "/sagas", `{headers: {'X-Forwarded-Email': 'olga@example.com', 'X-Forwarded-Groups': 'sre'}}`)
		require.Equal(t, http.StatusUnauthorized, status, body)
		require.Contains(t, body, "X-Forwarded-Email came from 127.0.0.1, which is not a trusted proxy")
		status, body = fetchText(t, tab, sagaPath("untouched")+"/abort", `{method: 'POST', headers: {'X-Forwarded-Email': 'olga@example.com', 'X-Forwarded-Groups': 'sre'},
			body: new URLSearchParams({reason: 'sneaky'})}`)
		require.Equal(t, http.StatusUnauthorized, status, body)

		// Through the proxy on a route it lets through unauthenticated.
		resp, err = chromedp.Run(tab, chromedp.NavigateResponse(openProxy.URL+"/sagas"))
		require.NoError(t, err)
		require.Equal(t, http.StatusUnauthorized, int(resp.Status))
		require.Zero(t, w.pendingRequests())
	})

	t.Run("proxy: a viewer sees no action and is refused 403", func(t *testing.T) {
		tab := userTab(t, tab)
		do(t, tab, chromedp.Navigate(veraProxy.URL+sagaPath("untouched")), chromedp.WaitVisible(chromedp.CSS("#history")))
		require.Equal(t, []string{"vera@example.com"}, attrs(t, tab, "#who", "data-user"))
		require.Equal(t, []string{"viewer"}, attrs(t, tab, "#who", "data-role"))
		require.Zero(t, eval[int](t, tab, `document.querySelectorAll('form[method=post], #actions, button').length`), "no action buttons")
		status, body := fetchText(t, tab, sagaPath("untouched")+"/terminate", forgePost(t, tab, veraProxy.URL))
		require.Equal(t, http.StatusForbidden, status, body)
		require.Contains(t, body, "vera@example.com is a viewer")
		require.Zero(t, w.pendingRequests())
	})

	t.Run("proxy: an operator's action is recorded under their identity", func(t *testing.T) {
		tab := userTab(t, tab)
		do(t, tab, chromedp.Navigate(olgaProxy.URL+sagaPath("proxy")), chromedp.WaitVisible(chromedp.CSS("#terminate-form")))
		require.Equal(t, []string{"operator"}, attrs(t, tab, "#who", "data-role"))
		do(t, tab, chromedp.SendKeys(chromedp.CSS(`#terminate-form input[name=reason]`), "fraud suspected"),
			chromedp.Click(chromedp.CSS(`#terminate-form button`)))
		waitJS(t, tab, "the outcome of the terminate", `!!document.querySelector('#flash')`)
		require.Contains(t, text(t, tab, "#flash"), "terminate applied")
		require.Equal(t, []string{"olga@example.com"}, attrs(t, tab, `#history tr.operator`, "data-actor"),
			"the saga's history names the operator")
		op := opOf(t, tab, orch)
		require.Equal(t, []string{"terminate", "olga@example.com", "fraud suspected"}, []string{op.Action, op.Actor, op.Reason})
	})

	s, err := orch.Get(context.Background(), held["untouched"].ID)
	require.NoError(t, err)
	require.Equal(t, saga.StatusRunning, s.Status, "the viewers' POSTs changed nothing")
}
