package console

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"
)

// apacheHash is `htpasswd -nbB -C 5 olga 'correct horse'` from Apache's
// apache2-utils: the "$2y$" form the console must take as it is.
const apacheHash = "$2y$05$qiY2sTnvpWNDLCQne9xZZekhFaP9N/mQpSOJFY5JZEaiEPuKD8Rnu"

// hashOf returns a bcrypt hash of password at the lowest cost (tests only).
func hashOf(t *testing.T, password string) string {
	t.Helper()
	h, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
	require.NoError(t, err)
	return string(h)
}

// writeFile writes content to a new file of the test and returns its path.
func writeFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "console.htpasswd")
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	return path
}

func TestParseHtpasswd(t *testing.T) {
	t.Parallel()
	vera := hashOf(t, "vera's password")
	users, err := parseHtpasswd("f", []byte("# the console's users\n\nolga:"+apacheHash+":operator\r\nvera:"+vera+"\n  ivan:"+vera+":Viewer  \n"))
	require.NoError(t, err)
	require.Len(t, users, 3)
	require.Equal(t, RoleOperator, users["olga"].role)
	require.Equal(t, RoleViewer, users["vera"].role, "no role: a viewer")
	require.Equal(t, RoleViewer, users["ivan"].role)
	require.Equal(t, apacheHash, string(users["olga"].hash))

	for name, tc := range map[string]struct {
		content string
		want    string
	}{
		"no colon":        {"olga" + apacheHash + "\n", "f:1: want user:bcrypt-hash or user:bcrypt-hash:role"},
		"too many fields": {"olga:" + apacheHash + ":operator:x\n", "f:1: want user:bcrypt-hash"},
		"empty user":      {"\n:" + apacheHash + "\n", "f:2: the user is empty"},
		"hash first":      {apacheHash + ":operator\n", "f:1: the line starts with a hash"},
		"space in user":   {"ol ga:" + apacheHash + "\n", "f:1: the user has spaces"},
		"MD5":             {"olga:$apr1$abcdefgh$0123456789abcdefghijkl\n", "f:1: user olga: the hash is not bcrypt's"},
		"SHA":             {"olga:{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=\n", "f:1: user olga: the hash is not bcrypt's"},
		"truncated":       {"olga:" + apacheHash[:59] + "\n", "f:1: user olga: the hash is not bcrypt's"},
		"bad cost":        {"olga:$2y$99" + apacheHash[6:] + "\n", "f:1: user olga: the hash is not bcrypt's"},
		"plain password":  {"olga:correct horse\n", "f:1: user olga: the hash is not bcrypt's"},
		"unknown role":    {"olga:" + apacheHash + ":admin\n", `f:1: user olga: role "admin": want viewer or operator`},
		"role none":       {"olga:" + apacheHash + ":none\n", `f:1: user olga: role "none": want viewer or operator`},
		"duplicate":       {"olga:" + apacheHash + "\n# x\nolga:" + vera + ":operator\n", "f:3: user olga again (first on line 1)"},
		"empty":           {"# nobody\n\n", "f: no user in it"},
	} {
		_, err := parseHtpasswd("f", []byte(tc.content))
		require.Error(t, err, name)
		require.Contains(t, err.Error(), tc.want, name)
	}
}

// An error about an htpasswd file never shows a hash, or its salt, whatever
// is wrong with the line the hash is on.
func TestHtpasswdErrorsNeverShowAHash(t *testing.T) {
	t.Parallel()
	secret := apacheHash[7:29] // the salt and the start of the digest
	for _, line := range []string{
		"olga" + apacheHash, "olga:" + apacheHash + ":admin", "olga:" + apacheHash + ":operator:x", ":" + apacheHash,
		apacheHash, apacheHash + ":operator", apacheHash + ":" + apacheHash, "ol ga:" + apacheHash, "olga:" + apacheHash + "x",
		"olga:" + apacheHash[:40], "olga:" + strings.Replace(apacheHash, "$2y$05", "$2y$99", 1), "olga\t" + apacheHash,
		"olga:" + apacheHash + "\nolga:" + apacheHash,
		"olga:x" + apacheHash, "\x00:" + apacheHash, apacheHash[:30] + ":" + apacheHash[30:],
	} {
		_, err := parseHtpasswd("f", []byte(line+"\n"))
		require.Error(t, err, "%q", line)
		require.NotContains(t, err.Error(), secret, "the error of %q", line)
	}
	path := writeFile(t, "olga:"+apacheHash+":root\n")
	_, err := ReadHtpasswdFile(path)
	require.ErrorContains(t, err, path+":1: user olga")
	require.NotContains(t, err.Error(), secret)
}

func TestReadHtpasswdFile(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "nosuch")
	_, err := ReadHtpasswdFile(missing)
	require.ErrorIs(t, err, os.ErrNotExist)
	require.ErrorContains(t, err, missing)
	_, err = ReadHtpasswdFile(t.TempDir())
	require.ErrorContains(t, err, "is a directory")
	roles, err := ReadHtpasswdFile(writeFile(t, "olga:"+apacheHash+":operator\nvera:"+apacheHash+"\n"))
	require.NoError(t, err)
	require.Equal(t, map[string]Role{"olga": RoleOperator, "vera": RoleViewer}, roles)
}

// countCompares makes h count its bcrypt comparisons, by the cost of the
// hash compared.
func countCompares(h *htpasswd) func() map[int]int {
	var mu sync.Mutex
	counts := map[int]int{}
	h.compare = func(hash, password []byte) error {
		cost, err := bcrypt.Cost(hash)
		if err != nil {
			cost = -1
		}
		mu.Lock()
		counts[cost]++
		mu.Unlock()
		return bcrypt.CompareHashAndPassword(hash, password)
	}
	return func() map[int]int {
		mu.Lock()
		defer mu.Unlock()
		out := map[int]int{}
		for k, v := range counts {
			out[k] = v
		}
		clear(counts)
		return out
	}
}

// A user of an htpasswd file signs in with their password (Apache's "$2y$"
// hashes included) and gets their role; a wrong password and an unknown
// user are refused, and each costs one bcrypt comparison at the users'
// cost, so that an unknown user takes as long as a known one; a password
// verified once is taken from the cache without bcrypt.
func TestHtpasswdAuthenticate(t *testing.T) {
	t.Parallel()
	h, err := loadHtpasswd(writeFile(t, "olga:"+apacheHash+":operator\n"))
	require.NoError(t, err)
	compares := countCompares(h)

	_, ok, _ := h.authenticate("olga", "wrong")
	require.False(t, ok)
	require.Equal(t, map[int]int{5: 1}, compares(), "a wrong password: one bcrypt")
	_, ok, _ = h.authenticate("mallory", "correct horse")
	require.False(t, ok)
	require.Equal(t, map[int]int{5: 1}, compares(), "an unknown user: one bcrypt at the users' cost too")
	_, ok, _ = h.authenticate("", "")
	require.False(t, ok)
	require.Equal(t, map[int]int{5: 1}, compares())

	role, ok, _ := h.authenticate("olga", "correct horse")
	require.True(t, ok)
	require.Equal(t, RoleOperator, role)
	require.Equal(t, map[int]int{5: 1}, compares())
	role, ok, _ = h.authenticate("olga", "correct horse")
	require.True(t, ok)
	require.Equal(t, RoleOperator, role)
	require.Empty(t, compares(), "verified lately: no bcrypt")
	_, ok, _ = h.authenticate("olga", "correct horse!")
	require.False(t, ok, "the cache holds one password, not a prefix")
	require.Equal(t, map[int]int{5: 1}, compares())
}

// The console reads its htpasswd file again when it changes: a user added
// signs in, a role changed applies, a user removed is refused; a changed
// file that does not parse (or is gone) is reported once and leaves the
// users as they were.
func TestHtpasswdReload(t *testing.T) {
	t.Parallel()
	vera := hashOf(t, "vera's password")
	path := writeFile(t, "olga:"+apacheHash+":operator\n")
	h, err := loadHtpasswd(path)
	require.NoError(t, err)
	// look makes the next sign-in look at the file, as it does once a
	// second.
	look := func() {
		h.mu.Lock()
		h.checked = time.Time{}
		h.mu.Unlock()
	}
	signIn := func(user, password string) (Role, bool, reloadEvent) {
		look()
		return h.authenticate(user, password)
	}

	_, ok, ev := signIn("vera", "vera's password")
	require.False(t, ok)
	require.Equal(t, reloadEvent{}, ev, "unchanged: nothing read")

	require.NoError(t, os.WriteFile(path, []byte("olga:"+apacheHash+":viewer\nvera:"+vera+":operator\n"), 0o600))
	role, ok, ev := signIn("vera", "vera's password")
	require.True(t, ok, "a user added")
	require.Equal(t, RoleOperator, role)
	require.Equal(t, reloadEvent{users: 2}, ev)
	role, ok, _ = signIn("olga", "correct horse")
	require.True(t, ok)
	require.Equal(t, RoleViewer, role, "a role changed")

	require.NoError(t, os.WriteFile(path, []byte("vera:"+vera+":operator\nolga:"+apacheHash+":admin\n"), 0o600))
	role, ok, ev = signIn("olga", "correct horse")
	require.ErrorContains(t, ev.err, path+":2: user olga")
	require.NotContains(t, ev.err.Error(), apacheHash[7:29])
	require.True(t, ok, "a file that does not parse leaves the users as they were")
	require.Equal(t, RoleViewer, role)
	_, _, ev = signIn("olga", "correct horse")
	require.Equal(t, reloadEvent{}, ev, "reported once per change")

	require.NoError(t, os.Remove(path))
	_, ok, ev = signIn("vera", "vera's password")
	require.ErrorIs(t, ev.err, os.ErrNotExist)
	require.True(t, ok, "a file gone leaves the users as they were")
	_, _, ev = signIn("vera", "vera's password")
	require.Equal(t, reloadEvent{}, ev, "reported once")

	require.NoError(t, os.WriteFile(path, []byte("vera:"+vera+"\n"), 0o600))
	_, ok, ev = signIn("olga", "correct horse")
	require.False(t, ok, "a user removed")
	require.Equal(t, reloadEvent{users: 1}, ev)
	role, ok, _ = signIn("vera", "vera's password")
	require.True(t, ok)
	require.Equal(t, RoleViewer, role)
}

func TestParseTrustedProxy(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"10.0.0.7":            "10.0.0.7/32",
		" 10.0.0.0/8 ":        "10.0.0.0/8",
		"10.1.2.3/8":          "10.0.0.0/8",
		"::1":                 "::1/128",
		"fd00::/8":            "fd00::/8",
		"::ffff:10.0.0.7":     "10.0.0.7/32",
		"::ffff:10.0.0.0/104": "10.0.0.0/8",
	} {
		p, err := ParseTrustedProxy(in)
		require.NoError(t, err, in)
		require.Equal(t, want, p.String(), in)
	}
	for _, in := range []string{"", "10.0.0.300", "10.0.0.0/33", "proxy.internal", "10.0.0.7:4180", "fe80::1%eth0", "10.0.0/8", "*"} {
		_, err := ParseTrustedProxy(in)
		require.Error(t, err, in)
		require.Contains(t, err.Error(), fmt.Sprintf("trusted proxy %q", in))
	}
}

func TestTrustedAddr(t *testing.T) {
	t.Parallel()
	var prefixes = mustPrefixes(t, "10.0.0.0/8", "192.168.1.7", "fd00::/8")
	for addr, want := range map[string]bool{
		"10.1.2.3:4180":          true,
		"192.168.1.7:50000":      true,
		"192.168.1.8:50000":      false,
		"[::ffff:10.0.0.1]:4180": true, // IPv4 on a dual-stack socket
		"[fd00::1]:4180":         true,
		"[fe80::1%eth0]:4180":    false,
		"127.0.0.1:4180":         false,
		"10.1.2.3":               true, // no port
		"":                       false,
		"garbage":                false,
	} {
		require.Equal(t, want, trustedAddr(prefixes, addr), addr)
	}
	require.False(t, trustedAddr(nil, "10.1.2.3:1"), "no trusted proxy: nobody")
}

func mustPrefixes(t *testing.T, ss ...string) []netip.Prefix {
	t.Helper()
	var out []netip.Prefix
	for _, s := range ss {
		p, err := ParseTrustedProxy(s)
		require.NoError(t, err)
		out = append(out, p)
	}
	return out
}

// The proxy trust check: the identity header is believed from a trusted
// proxy only, its groups map to the highest role, and a user the proxy
// vouches for without a role is refused.
func TestAuthenticateProxy(t *testing.T) {
	t.Parallel()
	cfg := AuthConfig{
		ProxyHeader: "x-forwarded-email", ProxyGroupsHeader: "X-Forwarded-Groups", TrustedProxies: []string{"10.0.0.0/8"},
		GroupRoles: map[string]Role{"sre": RoleOperator, "dev": RoleViewer},
	}.withDefaults()
	require.Empty(t, cfg.validate())
	var logs bytes.Buffer
	a, err := newAuthenticator(cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	require.NoError(t, err)
	none := cfg
	none.ProxyRole = RoleNone
	strict, err := newAuthenticator(none, slog.New(slog.DiscardHandler))
	require.NoError(t, err)

	req := func(remote string, header ...string) *http.Request {
		r := httptest.NewRequest(http.MethodGet, "/sagas", nil)
		r.RemoteAddr = remote
		for i := 0; i < len(header); i += 2 {
			r.Header.Add(header[i], header[i+1])
		}
		return r
	}
	for name, tc := range map[string]struct {
		a      *authenticator
		r      *http.Request
		who    identity
		status int
		msg    string
	}{
		"a user":                  {a, req("10.0.0.5:1", "X-Forwarded-Email", "olga@example.com"), identity{"olga@example.com", RoleViewer, "proxy"}, 0, ""},
		"groups, comma-separated": {a, req("10.0.0.5:1", "X-Forwarded-Email", "olga@example.com", "X-Forwarded-Groups", "dev, sre"), identity{"olga@example.com", RoleOperator, "proxy"}, 0, ""},
		"groups, repeated":        {a, req("10.0.0.5:1", "X-Forwarded-Email", "olga@example.com", "X-Forwarded-Groups", "dev", "X-Forwarded-Groups", "sre"), identity{"olga@example.com", RoleOperator, "proxy"}, 0, ""},
		"a group with a role":     {a, req("10.0.0.5:1", "X-Forwarded-Email", "vera@example.com", "X-Forwarded-Groups", "dev,qa"), identity{"vera@example.com", RoleViewer, "proxy"}, 0, ""},
		"no role":                 {strict, req("10.0.0.5:1", "X-Forwarded-Email", "ivan@example.com", "X-Forwarded-Groups", "qa"), identity{}, http.StatusForbidden, "ivan@example.com has no role"},
		"a role in strict":        {strict, req("10.0.0.5:1", "X-Forwarded-Email", "vera@example.com", "X-Forwarded-Groups", "dev"), identity{"vera@example.com", RoleViewer, "proxy"}, 0, ""},
		"untrusted":               {a, req("192.0.2.1:1", "X-Forwarded-Email", "olga@example.com", "X-Forwarded-Groups", "sre"), identity{}, http.StatusUnauthorized, "came from 192.0.2.1, which is not a trusted proxy"},
		"untrusted, empty":        {a, req("192.0.2.1:1", "X-Forwarded-Email", ""), identity{}, http.StatusUnauthorized, "not a trusted proxy"},
		"no header":               {a, req("10.0.0.5:1"), identity{}, http.StatusUnauthorized, "no identity"},
		"no header, untrusted":    {a, req("192.0.2.1:1"), identity{}, http.StatusUnauthorized, "no identity"},
		"empty name":              {a, req("10.0.0.5:1", "X-Forwarded-Email", "  "), identity{}, http.StatusUnauthorized, "empty"},
		"two users":               {a, req("10.0.0.5:1", "X-Forwarded-Email", "olga@example.com", "X-Forwarded-Email", "vera@example.com"), identity{}, http.StatusUnauthorized, "came 2 times"},
		"control characters":      {a, req("10.0.0.5:1", "X-Forwarded-Email", "olga\x01"), identity{}, http.StatusUnauthorized, "control characters"},
		"too long":                {a, req("10.0.0.5:1", "X-Forwarded-Email", strings.Repeat("o", 300)), identity{}, http.StatusUnauthorized, "at most 256"},
	} {
		who, err := tc.a.authenticate(tc.r)
		if tc.status == 0 {
			require.NoError(t, err, name)
			require.Equal(t, tc.who, who, name)
			continue
		}
		var ae *authError
		require.ErrorAs(t, err, &ae, name)
		require.Equal(t, tc.status, ae.status, name)
		require.Contains(t, ae.Error(), tc.msg, name)
	}

	// X-Forwarded-Proto is believed from a trusted proxy only.
	require.True(t, a.forwardedHTTPS(req("10.0.0.5:1", "X-Forwarded-Proto", "https")))
	require.True(t, a.forwardedHTTPS(req("10.0.0.5:1", "X-Forwarded-Proto", "HTTPS, http")))
	require.False(t, a.forwardedHTTPS(req("10.0.0.5:1", "X-Forwarded-Proto", "http")))
	require.False(t, a.forwardedHTTPS(req("192.0.2.1:1", "X-Forwarded-Proto", "https")))
}

// Config's validation names the field at fault.
func TestAuthConfigValidate(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		auth  AuthConfig
		actor bool
		want  string
	}{
		"no trusted proxy":   {AuthConfig{ProxyHeader: "X-Forwarded-User"}, false, `Auth.ProxyHeader "X-Forwarded-User" needs Auth.TrustedProxies`},
		"bad header":         {AuthConfig{ProxyHeader: "X Forwarded User", TrustedProxies: []string{"::1"}}, false, `Auth.ProxyHeader "X Forwarded User": not a header name`},
		"reserved header":    {AuthConfig{ProxyHeader: "authorization", TrustedProxies: []string{"::1"}}, false, `Auth.ProxyHeader "authorization": a standard header`},
		"bad proxy":          {AuthConfig{ProxyHeader: "X-User", TrustedProxies: []string{"::1", "10.0.0.300"}}, false, `Auth.TrustedProxies[1]: trusted proxy "10.0.0.300": not an IP address or CIDR prefix`},
		"groups alone":       {AuthConfig{ProxyGroupsHeader: "X-Groups", HtpasswdFile: "f"}, false, "Auth.ProxyGroupsHeader needs Auth.ProxyHeader"},
		"same headers":       {AuthConfig{ProxyHeader: "X-User", ProxyGroupsHeader: "x-user", TrustedProxies: []string{"::1"}}, false, `Auth.ProxyGroupsHeader "x-user" is Auth.ProxyHeader too`},
		"roles alone":        {AuthConfig{ProxyHeader: "X-User", TrustedProxies: []string{"::1"}, GroupRoles: map[string]Role{"sre": RoleOperator}}, false, "Auth.GroupRoles needs Auth.ProxyGroupsHeader"},
		"bad group role":     {AuthConfig{ProxyHeader: "X-User", ProxyGroupsHeader: "X-Groups", TrustedProxies: []string{"::1"}, GroupRoles: map[string]Role{"sre": "admin"}}, false, `Auth.GroupRoles["sre"] "admin": want viewer or operator`},
		"group with a comma": {AuthConfig{ProxyHeader: "X-User", ProxyGroupsHeader: "X-Groups", TrustedProxies: []string{"::1"}, GroupRoles: map[string]Role{"a,b": RoleViewer}}, false, `Auth.GroupRoles: group "a,b"`},
		"bad proxy role":     {AuthConfig{ProxyHeader: "X-User", TrustedProxies: []string{"::1"}, ProxyRole: "root"}, false, `Auth.ProxyRole "root": want viewer, operator or none`},
		"bad realm":          {AuthConfig{HtpasswdFile: "f", Realm: `say "hi"`}, false, "Auth.Realm"},
		"actor with auth":    {AuthConfig{HtpasswdFile: "f"}, true, "Actor must be unset when Auth authenticates"},
	} {
		cfg := Config{Auth: tc.auth, PageSize: 1}
		if tc.actor {
			cfg.Actor = func(*http.Request) string { return "alice" }
		}
		err := cfg.WithDefaults().validate()
		require.ErrorContains(t, err, tc.want, name)
	}
	// Without authentication, Actor is the console's to default.
	cfg := Config{}.WithDefaults()
	require.NotNil(t, cfg.Actor)
	require.Nil(t, Config{Auth: AuthConfig{HtpasswdFile: "f"}}.WithDefaults().Actor)
	// TrustedProxies alone (X-Forwarded-Proto only) is fine.
	require.Empty(t, AuthConfig{TrustedProxies: []string{"10.0.0.1"}}.withDefaults().validate())
}
