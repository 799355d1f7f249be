package cli_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"

	"github.com/sagabox/sagabox/cmd/sagabox/internal/cli"
	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
)

// startUI runs `sagabox ui` with args (on a free port of 127.0.0.1) on
// schema until the test ends, and returns its base URL and the mode its
// first line says; the command must exit 0 when interrupted.
func startUI(t *testing.T, schema string, args ...string) (base, mode string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr testkit.Buffer
	done := make(chan int, 1)
	go func() {
		done <- cli.Run(ctx, append([]string{"--database-url", dbtest.URL(), "--schema", schema, "ui", "--addr", "127.0.0.1:0"}, args...), &stdout, &stderr)
	}()
	t.Cleanup(func() {
		cancel()
		require.Equal(t, cli.ExitOK, <-done, stderr.String())
	})
	addrRe := regexp.MustCompile(`on (http://[0-9.:]+)/ \((.*)\); Ctrl-C stops it`)
	deadline := time.Now().Add(60 * time.Second)
	for {
		if m := addrRe.FindStringSubmatch(stdout.String()); m != nil {
			return m[1], m[2]
		}
		select {
		case code := <-done:
			done <- code
			t.Fatalf("sagabox ui exited %d: %s", code, stderr.String())
		case <-time.After(50 * time.Millisecond):
		}
		require.True(t, time.Now().Before(deadline), "sagabox ui printed no address: %s", stderr.String())
	}
}

// get fetches u through c with header and returns the status and body.
func get(t *testing.T, c *http.Client, u string, header http.Header) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, u, nil)
	require.NoError(t, err)
	req.Header = header
	resp, err := c.Do(req)
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return resp.StatusCode, string(b)
}

// TestUIServesTheConsoleReadOnly runs `sagabox ui` on a migrated schema: it
// prints its address and that it authenticates nobody, serves the pages,
// refuses a POST without --allow-actions, and exits 0 when interrupted.
func TestUIServesTheConsoleReadOnly(t *testing.T) {
	t.Parallel()
	db := dbtest.Store(t)
	base, line := startUI(t, db.Store.Schema())
	require.Equal(t, "read-only, no authentication", line)
	c := &http.Client{Timeout: 30 * time.Second}
	for _, page := range []string{"/sagas", "/outbox", "/requests", "/static/console.css"} {
		code, body := get(t, c, base+page, nil)
		require.Equal(t, http.StatusOK, code, page)
		if page == "/sagas" {
			require.Contains(t, body, "no authentication")
		}
	}
	resp, err := c.Post(base+"/sagas/01a2296a-f375-7cd0-96cd-028916168da3/abort", "application/x-www-form-urlencoded", strings.NewReader("reason=x"))
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
}

// writeHtpasswd writes an htpasswd file with olga (an operator) and vera
// (a viewer, no role given) and returns its path.
func writeHtpasswd(t *testing.T, extra string) string {
	t.Helper()
	var b strings.Builder
	for _, u := range []struct{ user, role string }{{"olga", ":operator"}, {"vera", ""}} {
		h, err := bcrypt.GenerateFromPassword([]byte(u.user+"'s password"), bcrypt.MinCost)
		require.NoError(t, err)
		fmt.Fprintf(&b, "%s:%s%s\n", u.user, h, u.role)
	}
	b.WriteString(extra)
	path := filepath.Join(t.TempDir(), "console.htpasswd")
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o600))
	return path
}

// `sagabox ui --htpasswd` signs users in against the file: it says so when
// it starts, refuses a request without a valid user with 401, and serves
// a viewer.
func TestUIWithBasicAuth(t *testing.T) {
	t.Parallel()
	db := dbtest.Store(t)
	path := writeHtpasswd(t, "")
	base, line := startUI(t, db.Store.Schema(), "--allow-actions", "--htpasswd", path)
	require.Equal(t, "operators may act; sign-in: basic auth against "+path+" (2 users, 1 operator)", line)
	c := &http.Client{Timeout: 30 * time.Second}
	code, _ := get(t, c, base+"/sagas", nil)
	require.Equal(t, http.StatusUnauthorized, code)
	code, _ = get(t, c, base+"/sagas", http.Header{"Authorization": {basic("vera", "olga's password")}})
	require.Equal(t, http.StatusUnauthorized, code)
	code, body := get(t, c, base+"/sagas", http.Header{"Authorization": {basic("vera", "vera's password")}})
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `data-user="vera" data-role="viewer"`)
}

func basic(user, password string) string {
	req, _ := http.NewRequest(http.MethodGet, "http://x", nil)
	req.SetBasicAuth(user, password)
	return req.Header.Get("Authorization")
}

// `sagabox ui --auth-header` believes the header from --trusted-proxy
// only: from 127.0.0.1 it is refused with 401, from 127.0.0.2 (the
// proxy) the user is signed in with the role of their groups.
func TestUIBehindAProxy(t *testing.T) {
	t.Parallel()
	db := dbtest.Store(t)
	base, line := startUI(t, db.Store.Schema(), "--allow-actions", "--auth-header", "X-Forwarded-Email",
		"--trusted-proxy", "127.0.0.2,10.0.0.0/8", "--groups-header", "X-Forwarded-Groups", "--group-role", "sre=operator", "--proxy-role", "none")
	require.Equal(t, "operators may act; sign-in: the user in X-Forwarded-Email from 127.0.0.2, 10.0.0.0/8", line)
	from := func(ip string) *http.Client {
		dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 10 * time.Second}
		tr := &http.Transport{DialContext: dialer.DialContext}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr, Timeout: 30 * time.Second}
	}
	olga := http.Header{"X-Forwarded-Email": {"olga@example.com"}, "X-Forwarded-Groups": {"sre"}}
	code, body := get(t, from("127.0.0.1"), base+"/sagas", olga)
	require.Equal(t, http.StatusUnauthorized, code, body)
	require.Contains(t, body, "not a trusted proxy")
	code, body = get(t, from("127.0.0.2"), base+"/sagas", olga)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `data-user="olga@example.com" data-role="operator"`)
	code, body = get(t, from("127.0.0.2"), base+"/sagas", http.Header{"X-Forwarded-Email": {"ivan@example.com"}, "X-Forwarded-Groups": {"qa"}})
	require.Equal(t, http.StatusForbidden, code, "--proxy-role none: %s", body)
}

// Bad authentication flags are refused at once (exit 2), each error naming
// the flag and what is wrong; an htpasswd file's hash is never printed.
func TestUIRefusesBadAuthFlags(t *testing.T) {
	t.Parallel()
	db := dbtest.Store(t)
	missing := filepath.Join(t.TempDir(), "nosuch.htpasswd")
	hash, err := bcrypt.GenerateFromPassword([]byte("secret"), bcrypt.MinCost)
	require.NoError(t, err)
	malformed := writeHtpasswd(t, "ivan:"+string(hash)+":admin\n")
	notBcrypt := writeHtpasswd(t, "ivan:$apr1$abcdefgh$0123456789abcdefghijkl\n")
	noColon := writeHtpasswd(t, "ivan"+string(hash)+"\n")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--htpasswd", missing}, "--htpasswd: open " + missing + ": no such file or directory"},
		{[]string{"--htpasswd", malformed}, "--htpasswd: " + malformed + `:3: user ivan: role "admin": want viewer or operator`},
		{[]string{"--htpasswd", notBcrypt}, "--htpasswd: " + notBcrypt + ":3: user ivan: the hash is not bcrypt's"},
		{[]string{"--htpasswd", noColon}, "--htpasswd: " + noColon + ":3: want user:bcrypt-hash or user:bcrypt-hash:role"},
		{[]string{"--auth-header", "X-Forwarded-Email", "--trusted-proxy", "10.0.0.300"}, `--trusted-proxy: trusted proxy "10.0.0.300": not an IP address or CIDR prefix`},
		{[]string{"--auth-header", "X-Forwarded-Email", "--trusted-proxy", "proxy.internal"}, `--trusted-proxy: trusted proxy "proxy.internal"`},
		{[]string{"--auth-header", "X-Forwarded-Email", "--trusted-proxy", "10.0.0.0/40"}, `--trusted-proxy: trusted proxy "10.0.0.0/40": not a CIDR prefix`},
		{[]string{"--auth-header", "X-Forwarded-Email"}, "--auth-header X-Forwarded-Email needs --trusted-proxy"},
		{[]string{"--auth-header", "Authorization", "--trusted-proxy", "::1"}, `Auth.ProxyHeader "Authorization": a standard header`},
		{[]string{"--groups-header", "X-Forwarded-Groups", "--htpasswd", malformed}, "--groups-header needs --auth-header"},
		{[]string{"--auth-header", "X-U", "--trusted-proxy", "::1", "--group-role", "sre=operator"}, "--group-role needs --groups-header"},
		{[]string{"--auth-header", "X-U", "--trusted-proxy", "::1", "--groups-header", "X-G", "--group-role", "sre"}, `--group-role "sre": want GROUP=ROLE`},
		{[]string{"--auth-header", "X-U", "--trusted-proxy", "::1", "--groups-header", "X-G", "--group-role", "sre=root"}, `--group-role "sre=root": role "root": want viewer or operator`},
		{[]string{"--auth-header", "X-U", "--trusted-proxy", "::1", "--proxy-role", "admin"}, `--proxy-role: role "admin": want viewer or operator (or none)`},
		{[]string{"--htpasswd", writeHtpasswd(t, ""), "--actor", "alice"}, "--actor cannot be used with --htpasswd or --auth-header"},
	} {
		r := run(t, append([]string{"--schema", db.Store.Schema(), "ui", "--addr", "127.0.0.1:0"}, tc.args...)...)
		require.Equal(t, cli.ExitUsage, r.code, "%v: %s", tc.args, r.stderr)
		require.Contains(t, r.stderr, tc.want, "%v", tc.args)
		require.NotContains(t, r.stderr, string(hash[7:29]), "%v: no hash printed", tc.args)
		require.Empty(t, r.stdout, "%v: nothing served", tc.args)
	}
}
