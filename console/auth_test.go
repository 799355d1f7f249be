package console_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"

	"github.com/sagabox/sagabox/console"
)

// csrfSecret keys the CSRF tokens of the tests' consoles, so that a test
// can forge a valid token: what an attacker who got past the CSRF checks
// would have, to show that the role refuses the request by itself.
var csrfSecret = []byte("the tests' CSRF secret, 32 bytes")

// csrfCookie is the console's CSRF cookie.
const csrfCookie = "sagabox_console_csrf"

// forgedCSRF returns a nonce for the CSRF cookie and the form token that
// goes with it under csrfSecret.
func forgedCSRF() (nonce, token string) {
	nonce = strings.Repeat("0f", 16)
	m := hmac.New(sha256.New, csrfSecret)
	m.Write([]byte(nonce))
	return nonce, hex.EncodeToString(m.Sum(nil))
}

// The tests' users and their passwords.
const (
	operatorUser, operatorPassword = "olga", "olga's long passphrase"
	viewerUser, viewerPassword     = "vera", "vera's long passphrase"
)

// htpasswdFile writes an htpasswd file of the tests' users (olga an
// operator, vera a viewer) and returns its path.
func htpasswdFile(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("# the console's users: user:bcrypt-hash:role\n")
	for _, u := range []struct{ user, password, role string }{{operatorUser, operatorPassword, ":operator"}, {viewerUser, viewerPassword, ""}} {
		h, err := bcrypt.GenerateFromPassword([]byte(u.password), bcrypt.MinCost)
		require.NoError(t, err)
		fmt.Fprintf(&b, "%s:%s%s\n", u.user, h, u.role)
	}
	path := filepath.Join(t.TempDir(), "console.htpasswd")
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o600))
	return path
}

// logRecorder keeps the records of a JSON slog handler.
type logRecorder struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logRecorder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// records returns the records whose message is msg.
func (l *logRecorder) records(t *testing.T, msg string) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.buf.String()), "\n") {
		if line == "" {
			continue
		}
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec), line)
		if rec["msg"] == msg {
			out = append(out, rec)
		}
	}
	return out
}

// as is a client that signs in as user with password (none when user is
// empty).
func as(t *testing.T, user, password string) *http.Client {
	t.Helper()
	c := client(t)
	if user != "" {
		c.Transport = basicAuth{user: user, password: password}
	}
	return c
}

type basicAuth struct{ user, password string }

func (b basicAuth) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.SetBasicAuth(b.user, b.password)
	return http.DefaultTransport.RoundTrip(r)
}

// fromAddr is a client whose connections come from local address ip (any
// of 127.0.0.0/8 on Linux), as a proxy's would: the console tells a
// trusted proxy by the connection's address.
func fromAddr(t *testing.T, ip string) *http.Client {
	t.Helper()
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 10 * time.Second}
	tr := &http.Transport{DialContext: dialer.DialContext}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Jar: jar, Transport: tr, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// answer is a response whose body was read and closed.
type answer struct {
	StatusCode int
	Header     http.Header
}

// Cookies returns the cookies the response sets.
func (a answer) Cookies() []*http.Cookie { return (&http.Response{Header: a.Header}).Cookies() }

// send sends a request with header and returns the response and its body.
func send(t *testing.T, c *http.Client, method, u string, form url.Values, header http.Header) (answer, string) {
	t.Helper()
	var body *strings.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	} else {
		body = strings.NewReader("")
	}
	req, err := http.NewRequest(method, u, body)
	require.NoError(t, err)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	var b bytes.Buffer
	_, err = b.ReadFrom(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return answer{StatusCode: resp.StatusCode, Header: resp.Header}, b.String()
}

// requireSecurityHeaders checks the headers every response of the console
// carries.
func requireSecurityHeaders(t *testing.T, resp answer, what string) {
	t.Helper()
	h := resp.Header
	csp := h.Get("Content-Security-Policy")
	for _, d := range []string{"default-src 'self'", "script-src 'none'", "frame-ancestors 'none'", "form-action 'self'", "object-src 'none'", "base-uri 'none'"} {
		require.Contains(t, csp, d, "%s: Content-Security-Policy", what)
	}
	require.Equal(t, "nosniff", h.Get("X-Content-Type-Options"), what)
	require.Equal(t, "DENY", h.Get("X-Frame-Options"), what)
	require.Equal(t, "same-origin", h.Get("Referrer-Policy"), what)
}

// csrfCookieOf returns the CSRF cookie resp sets.
func csrfCookieOf(t *testing.T, resp answer) *http.Cookie {
	t.Helper()
	for _, ck := range resp.Cookies() {
		if ck.Name == csrfCookie {
			return ck
		}
	}
	t.Fatalf("no %s cookie set: %v", csrfCookie, resp.Header.Values("Set-Cookie"))
	return nil
}

// TestConsoleBasicAuth runs a console that authenticates against an
// htpasswd file: every request without a valid user and password is
// refused 401 with a challenge (pages, static files, POSTs; unknown users
// and wrong passwords alike); a viewer reads but is offered no action and
// is refused 403 on a POST that passes the CSRF checks; an operator's
// actions are recorded under their name, whatever actor the form says,
// and so is the replay of a dead outbox row in its log line.
func TestConsoleBasicAuth(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	orch := w.orchestrator(nil)
	st := w.start(orch, holding(), Order{ID: "o-1"}, "order-1")
	var logs logRecorder
	h, err := console.New(console.Config{
		Pool: w.pool, Schema: w.orch.Store.Schema(), MessagingSchemas: []string{w.svc.Store.Schema()}, AllowActions: true,
		ActionWait: 100 * time.Millisecond, Secret: csrfSecret, Logger: slog.New(slog.NewJSONHandler(&logs, nil)),
		Auth: console.AuthConfig{HtpasswdFile: htpasswdFile(t)},
	})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	sagaURL := srv.URL + "/sagas/" + st.ID.String()

	t.Run("unauthenticated requests get 401", func(t *testing.T) {
		for name, c := range map[string]*http.Client{
			"no user":        as(t, "", ""),
			"wrong password": as(t, operatorUser, viewerPassword),
			"unknown user":   as(t, "mallory", operatorPassword),
			"empty password": as(t, viewerUser, ""),
		} {
			for _, req := range []struct{ method, path string }{
				{"GET", "/"}, {"GET", "/sagas"}, {"GET", "/sagas/" + st.ID.String()}, {"GET", "/outbox"}, {"GET", "/requests"},
				{"GET", "/static/console.css"}, {"GET", "/nosuch"}, {"POST", "/sagas/" + st.ID.String() + "/abort"},
			} {
				resp, body := send(t, c, req.method, srv.URL+req.path, url.Values{"reason": {"x"}}, nil)
				what := fmt.Sprintf("%s: %s %s", name, req.method, req.path)
				require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "%s: %s", what, body)
				require.Equal(t, `Basic realm="sagabox console", charset="UTF-8"`, resp.Header.Get("WWW-Authenticate"), what)
				require.NotContains(t, body, st.ID.String(), "%s: a refused request shows nothing", what)
				requireSecurityHeaders(t, resp, what)
			}
		}
		require.Zero(t, w.pendingRequests())
		refused := logs.records(t, "console sign-in refused")
		require.NotEmpty(t, refused)
		for _, rec := range refused {
			require.NotContains(t, fmt.Sprint(rec), "passphrase", "a refused sign-in logs no password")
		}
	})

	t.Run("a viewer reads and may not act", func(t *testing.T) {
		c := as(t, viewerUser, viewerPassword)
		resp, body := send(t, c, "GET", sagaURL, nil, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		require.Contains(t, body, `data-user="vera" data-role="viewer"`, "the header names the user and role")
		require.Contains(t, body, `id="mode">read-only<`)
		require.NotContains(t, body, `method="post"`, "no action offered")
		require.NotContains(t, body, `name="csrf"`)
		require.NotContains(t, resp.Header.Values("Set-Cookie"), csrfCookie, "no form: no CSRF cookie")
		requireSecurityHeaders(t, resp, "a page")

		// A POST that passes both CSRF checks (same origin, a valid
		// token with its cookie): the role refuses it.
		nonce, token := forgedCSRF()
		u, err := url.Parse(srv.URL)
		require.NoError(t, err)
		c.Jar.SetCookies(u, []*http.Cookie{{Name: csrfCookie, Value: nonce, Path: "/"}})
		for _, action := range []string{"abort", "retry", "terminate"} {
			resp, body = send(t, c, "POST", sagaURL+"/"+action, url.Values{"reason": {"sneaky"}, "csrf": {token}},
				http.Header{"Origin": {srv.URL}, "Sec-Fetch-Site": {"same-origin"}})
			require.Equal(t, http.StatusForbidden, resp.StatusCode, body)
			require.Contains(t, body, "vera is a viewer: only an operator may")
		}
		resp, body = send(t, c, "POST", srv.URL+"/outbox/"+w.svc.Store.Schema()+"/dead/1/replay", url.Values{"reason": {"sneaky"}, "csrf": {token}}, nil)
		require.Equal(t, http.StatusForbidden, resp.StatusCode, body)
		require.Contains(t, body, "vera is a viewer")
		require.Zero(t, w.pendingRequests(), "nothing recorded")
	})

	t.Run("an operator's action is recorded under their name", func(t *testing.T) {
		c := as(t, operatorUser, operatorPassword)
		resp, body := send(t, c, "GET", sagaURL, nil, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		require.Contains(t, body, `data-user="olga" data-role="operator"`)
		require.Contains(t, body, `id="abort-form"`)
		require.NotContains(t, body, `name="actor"`, "nobody types the actor")
		ck := csrfCookieOf(t, resp)
		require.True(t, ck.HttpOnly)
		require.Equal(t, http.SameSiteStrictMode, ck.SameSite)
		require.False(t, ck.Secure, "plain HTTP, no proxy: not Secure (the browser would drop it)")
		token := tokenRe.FindStringSubmatch(body)[1]

		resp, body = send(t, c, "POST", sagaURL+"/abort", url.Values{"reason": {"customer called"}, "csrf": {token}, "actor": {"mallory"}}, nil)
		require.Equal(t, http.StatusSeeOther, resp.StatusCode, body)
		requireSecurityHeaders(t, resp, "a redirect")
		ops, err := orch.ListRequests(context.Background(), nil)
		require.NoError(t, err)
		require.Len(t, ops, 1)
		require.Equal(t, []string{"abort", operatorUser, "customer called"}, []string{ops[0].Action, ops[0].Actor, ops[0].Reason},
			"the authenticated user, not the form's actor")

		svc := pgx.Identifier{w.svc.Store.Schema()}.Sanitize()
		var row int64
		require.NoError(t, w.pool.QueryRow(context.Background(), `INSERT INTO `+svc+`.sagabox_outbox
			(message_id, ordering_key, kind, type, routing_key, payload, published_at, dead_at, last_error, publish_attempts)
			VALUES (gen_random_uuid(), 'k', 'event', 'shop.noticed', 'nowhere', '\x7b7d', now(), now(), 'unroutable', 5)
			RETURNING id`).Scan(&row))
		resp, body = send(t, c, "POST", fmt.Sprintf("%s/outbox/%s/dead/%d/replay", srv.URL, w.svc.Store.Schema(), row),
			url.Values{"reason": {"queue declared"}, "csrf": {token}, "actor": {"mallory"}}, nil)
		require.Equal(t, http.StatusSeeOther, resp.StatusCode, body)
		require.Contains(t, resp.Header.Get("Location"), "replayed+by+olga")
		replays := logs.records(t, "dead outbox row replayed by operator")
		require.Len(t, replays, 1)
		require.Equal(t, operatorUser, replays[0]["actor"])
		require.Equal(t, float64(row), replays[0]["outbox_id"])
	})

	t.Run("over TLS the CSRF cookie is Secure", func(t *testing.T) {
		tlsSrv := httptest.NewTLSServer(h)
		t.Cleanup(tlsSrv.Close)
		c := tlsSrv.Client()
		c.Transport = tlsBasicAuth{base: c.Transport, user: operatorUser, password: operatorPassword}
		resp, body := send(t, c, "GET", tlsSrv.URL+"/sagas/"+st.ID.String(), nil, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		ck := csrfCookieOf(t, resp)
		require.True(t, ck.Secure)
		require.True(t, ck.HttpOnly)
		require.Equal(t, http.SameSiteStrictMode, ck.SameSite)
	})
}

type tlsBasicAuth struct {
	base           http.RoundTripper
	user, password string
}

func (b tlsBasicAuth) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.SetBasicAuth(b.user, b.password)
	return b.base.RoundTrip(r)
}

// The proxy's address in the tests: the console believes the identity
// header from it alone. The tests' other clients come from 127.0.0.1.
const proxyAddr = "127.0.0.2"

// TestConsoleProxyAuth runs a console behind an authenticating proxy that
// names the user in X-Forwarded-Email and their groups in
// X-Forwarded-Groups: from the proxy's address, the user acts with the
// role of their groups and is the actor recorded; from anywhere else, the
// same headers are refused 401, as is a request without the identity; the
// CSRF cookie is Secure when the proxy says it was reached over HTTPS.
func TestConsoleProxyAuth(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	orch := w.orchestrator(nil)
	st := w.start(orch, holding(), Order{ID: "o-1"}, "order-1")
	h, err := console.New(console.Config{
		Pool: w.pool, Schema: w.orch.Store.Schema(), AllowActions: true, ActionWait: 100 * time.Millisecond, Secret: csrfSecret,
		BasePath: "/console",
		Auth: console.AuthConfig{
			ProxyHeader: "X-Forwarded-Email", ProxyGroupsHeader: "X-Forwarded-Groups", TrustedProxies: []string{proxyAddr},
			GroupRoles: map[string]console.Role{"sre": console.RoleOperator},
		},
	})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/console/", h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	sagaURL := srv.URL + "/console/sagas/" + st.ID.String()
	olga := http.Header{"X-Forwarded-Email": {"olga@example.com"}, "X-Forwarded-Groups": {"dev,sre"}}
	vera := http.Header{"X-Forwarded-Email": {"vera@example.com"}, "X-Forwarded-Groups": {"dev"}}

	t.Run("the identity header from an untrusted address gets 401", func(t *testing.T) {
		for _, path := range []string{"/console/sagas", "/console/sagas/" + st.ID.String(), "/console/static/console.css"} {
			resp, body := send(t, fromAddr(t, "127.0.0.1"), "GET", srv.URL+path, nil, olga)
			require.Equal(t, http.StatusUnauthorized, resp.StatusCode, body)
			require.Contains(t, body, "X-Forwarded-Email came from 127.0.0.1, which is not a trusted proxy")
			require.Empty(t, resp.Header.Get("WWW-Authenticate"), "no basic auth to offer")
			requireSecurityHeaders(t, resp, path)
		}
		resp, body := send(t, fromAddr(t, "127.0.0.1"), "POST", sagaURL+"/abort", url.Values{"reason": {"x"}}, olga)
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode, body)
		require.Zero(t, w.pendingRequests())
	})

	t.Run("no identity gets 401", func(t *testing.T) {
		for _, addr := range []string{proxyAddr, "127.0.0.1"} {
			resp, body := send(t, fromAddr(t, addr), "GET", srv.URL+"/console/sagas", nil, nil)
			require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "from %s: %s", addr, body)
			require.Contains(t, body, "no identity")
		}
	})

	t.Run("a viewer by their groups may not act", func(t *testing.T) {
		c := fromAddr(t, proxyAddr)
		resp, body := send(t, c, "GET", sagaURL, nil, vera)
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		require.Contains(t, body, `data-user="vera@example.com" data-role="viewer"`)
		require.NotContains(t, body, `method="post"`)
		nonce, token := forgedCSRF()
		resp, body = send(t, c, "POST", sagaURL+"/abort", url.Values{"reason": {"sneaky"}, "csrf": {token}},
			http.Header{"X-Forwarded-Email": vera["X-Forwarded-Email"], "X-Forwarded-Groups": vera["X-Forwarded-Groups"],
				"Cookie": {csrfCookie + "=" + nonce}, "Sec-Fetch-Site": {"same-origin"}})
		require.Equal(t, http.StatusForbidden, resp.StatusCode, body)
		require.Contains(t, body, "vera@example.com is a viewer")
		require.Zero(t, w.pendingRequests())
	})

	t.Run("an operator by their groups acts under their name", func(t *testing.T) {
		c := fromAddr(t, proxyAddr)
		https := http.Header{"X-Forwarded-Proto": {"https"}}
		for k, v := range olga {
			https[k] = v
		}
		resp, body := send(t, c, "GET", sagaURL, nil, https)
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		require.Contains(t, body, `data-user="olga@example.com" data-role="operator"`)
		ck := csrfCookieOf(t, resp)
		require.True(t, ck.Secure, "the proxy was reached over HTTPS")
		require.True(t, ck.HttpOnly)
		require.Equal(t, http.SameSiteStrictMode, ck.SameSite)
		require.Equal(t, "/console/", ck.Path)

		resp, body = send(t, fromAddr(t, proxyAddr), "GET", sagaURL, nil, olga)
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		ck = csrfCookieOf(t, resp)
		require.False(t, ck.Secure, "the proxy was reached over HTTP")
		token := tokenRe.FindStringSubmatch(body)[1]
		resp, body = send(t, c, "POST", sagaURL+"/terminate", url.Values{"reason": {"fraud"}, "csrf": {token}},
			http.Header{"X-Forwarded-Email": olga["X-Forwarded-Email"], "X-Forwarded-Groups": olga["X-Forwarded-Groups"],
				"Cookie": {csrfCookie + "=" + ck.Value}})
		require.Equal(t, http.StatusSeeOther, resp.StatusCode, body)
		ops, err := orch.ListRequests(context.Background(), nil)
		require.NoError(t, err)
		require.Len(t, ops, 1)
		require.Equal(t, []string{"terminate", "olga@example.com"}, []string{ops[0].Action, ops[0].Actor})
	})
}

// Without authentication the console says so in its header, with the
// actor its actions are recorded as.
func TestConsoleWithoutAuthSaysSo(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	for _, allow := range []bool{false, true} {
		h, err := console.New(console.Config{Pool: w.pool, Schema: w.orch.Store.Schema(), AllowActions: allow,
			Actor: func(*http.Request) string { return "alice" }})
		require.NoError(t, err)
		srv := httptest.NewServer(h)
		resp, body := send(t, client(t), "GET", srv.URL+"/sagas", nil, nil)
		srv.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		require.Contains(t, body, `id="no-auth"`)
		require.Contains(t, body, "no authentication")
		if allow {
			require.Contains(t, body, `actions recorded as <span id="actor">alice</span>`)
		} else {
			require.NotContains(t, body, "actions recorded as")
		}
		requireSecurityHeaders(t, resp, "a page without authentication")
	}
	_, err := console.New(console.Config{Pool: w.pool, Schema: w.orch.Store.Schema(), Auth: console.AuthConfig{HtpasswdFile: htpasswdFile(t)},
		Actor: func(*http.Request) string { return "alice" }})
	require.ErrorContains(t, err, "Actor must be unset when Auth authenticates")
	_, err = console.New(console.Config{Pool: w.pool, Schema: w.orch.Store.Schema(), Auth: console.AuthConfig{HtpasswdFile: filepath.Join(t.TempDir(), "nosuch")}})
	require.ErrorContains(t, err, "Auth.HtpasswdFile: open ")
}
