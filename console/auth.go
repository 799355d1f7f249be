package console

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Role is what an authenticated user may do in the console.
type Role string

// The roles. A viewer reads every page; an operator may also act (retry,
// abort, terminate, restart a saga, replay a dead outbox row) when the
// console allows actions (Config.AllowActions).
const (
	// RoleViewer reads everything and may not act.
	RoleViewer Role = "viewer"
	// RoleOperator may act, when Config.AllowActions is set.
	RoleOperator Role = "operator"
	// RoleNone is no role: only for AuthConfig.ProxyRole, where it refuses
	// (403) a user the proxy vouches for whom no group of
	// AuthConfig.GroupRoles names.
	RoleNone Role = "none"
)

// ParseRole returns the role named s, "viewer" or "operator" (in any
// case). RoleNone is not a role a user can have, and not parsed here.
func ParseRole(s string) (Role, error) {
	switch r := Role(strings.ToLower(strings.TrimSpace(s))); r {
	case RoleViewer, RoleOperator:
		return r, nil
	}
	return "", fmt.Errorf("role %q: want viewer or operator", s)
}

// rank orders the roles: the highest of a user's groups wins.
func (r Role) rank() int {
	switch r {
	case RoleOperator:
		return 2
	case RoleViewer:
		return 1
	default:
		return 0
	}
}

// Defaults of AuthConfig.
const (
	// DefaultRealm is the realm the console's basic-auth challenge names.
	DefaultRealm = "sagabox console"
	// DefaultProxyRole is the role of a user the proxy vouches for whom no
	// group maps to a role.
	DefaultProxyRole = RoleViewer
)

// AuthConfig says how the console authenticates who uses it. Set
// ProxyHeader (with TrustedProxies), HtpasswdFile, or both; with neither,
// the console authenticates nobody (keep it on localhost, or mount it
// behind the service's own authentication, and set Config.Actor).
//
// With authentication on, every request must authenticate (401 otherwise,
// pages and static files alike); the actor recorded with each action is the
// authenticated user (Config.Actor must be unset); a viewer sees no action
// and is answered 403 on a POST.
type AuthConfig struct {
	// ProxyHeader is the header in which an authenticating reverse proxy
	// (oauth2-proxy, an OIDC front end) names the user, e.g.
	// "X-Forwarded-Email" or "X-Forwarded-User". It is believed only from
	// a TrustedProxies address: a request from anywhere else that carries
	// it is refused (401). Defaults to "" (no proxy authentication).
	ProxyHeader string
	// ProxyGroupsHeader is the header in which the proxy lists the user's
	// groups (comma-separated and/or repeated, as oauth2-proxy's
	// X-Forwarded-Groups), mapped to roles by GroupRoles. Requires
	// ProxyHeader. Defaults to "" (no groups).
	ProxyGroupsHeader string
	// GroupRoles maps a group of ProxyGroupsHeader to a role (RoleViewer
	// or RoleOperator); a user gets the highest role of their groups.
	// Requires ProxyGroupsHeader. Defaults to none.
	GroupRoles map[string]Role
	// ProxyRole is the role of a user the proxy vouches for whom no group
	// of GroupRoles names: RoleViewer, RoleOperator, or RoleNone to refuse
	// them (403). Defaults to DefaultProxyRole (viewer).
	ProxyRole Role
	// TrustedProxies are the addresses of the proxies whose ProxyHeader,
	// ProxyGroupsHeader and X-Forwarded-Proto the console believes: IP
	// addresses ("10.0.0.7", "::1") or CIDR prefixes ("10.0.0.0/8"),
	// matched against the address of the connection's peer (never against
	// X-Forwarded-For). Required with ProxyHeader; may be set without it
	// (then only X-Forwarded-Proto is believed, for the cookie's Secure
	// flag). Defaults to none.
	TrustedProxies []string
	// HtpasswdFile is a file of users for HTTP basic auth, one a line:
	// "user:bcrypt-hash:role" (the hash as `htpasswd -nB user` prints it,
	// "$2y$…"; the role viewer or operator, viewer when left out; "#"
	// starts a comment line). It is read by New (an error names the line
	// at fault, never a hash) and again when it changes (checked at most
	// once a second; a changed file that does not parse is logged and the
	// users read last stay). Defaults to "" (no basic auth).
	HtpasswdFile string
	// Realm is the realm of the basic-auth challenge. Defaults to
	// DefaultRealm ("sagabox console").
	Realm string
}

// enabled reports whether the console authenticates.
func (a AuthConfig) enabled() bool { return a.ProxyHeader != "" || a.HtpasswdFile != "" }

// withDefaults returns a with its defaults set.
func (a AuthConfig) withDefaults() AuthConfig {
	if a.ProxyRole == "" {
		a.ProxyRole = DefaultProxyRole
	}
	if a.Realm == "" {
		a.Realm = DefaultRealm
	}
	return a
}

// validate checks a; every error names the field at fault. Config.validate
// calls it; New reads HtpasswdFile afterwards.
func (a AuthConfig) validate() []error {
	var errs []error
	for _, h := range []struct{ field, name string }{{"Auth.ProxyHeader", a.ProxyHeader}, {"Auth.ProxyGroupsHeader", a.ProxyGroupsHeader}} {
		if h.name != "" && !validHeaderName(h.name) {
			errs = append(errs, fmt.Errorf("%s %q: not a header name", h.field, h.name))
		}
		if reserved(h.name) {
			errs = append(errs, fmt.Errorf("%s %q: a standard header, which a browser sends itself: name the proxy's own header (e.g. X-Forwarded-Email)", h.field, h.name))
		}
	}
	if a.ProxyHeader != "" && len(a.TrustedProxies) == 0 {
		errs = append(errs, fmt.Errorf("Auth.ProxyHeader %q needs Auth.TrustedProxies: the addresses of the proxies it is believed from", a.ProxyHeader))
	}
	if a.ProxyGroupsHeader != "" && a.ProxyHeader == "" {
		errs = append(errs, errors.New("Auth.ProxyGroupsHeader needs Auth.ProxyHeader"))
	}
	if a.ProxyGroupsHeader != "" && strings.EqualFold(a.ProxyGroupsHeader, a.ProxyHeader) {
		errs = append(errs, fmt.Errorf("Auth.ProxyGroupsHeader %q is Auth.ProxyHeader too", a.ProxyGroupsHeader))
	}
	if len(a.GroupRoles) > 0 && a.ProxyGroupsHeader == "" {
		errs = append(errs, errors.New("Auth.GroupRoles needs Auth.ProxyGroupsHeader: the header the groups come in"))
	}
	groups := make([]string, 0, len(a.GroupRoles))
	for g := range a.GroupRoles {
		groups = append(groups, g)
	}
	slices.Sort(groups)
	for _, g := range groups {
		if strings.TrimSpace(g) == "" || strings.Contains(g, ",") {
			errs = append(errs, fmt.Errorf("Auth.GroupRoles: group %q: want a group name without commas", g))
		}
		if r := a.GroupRoles[g]; r != RoleViewer && r != RoleOperator {
			errs = append(errs, fmt.Errorf("Auth.GroupRoles[%q] %q: want viewer or operator", g, r))
		}
	}
	if a.ProxyRole != RoleViewer && a.ProxyRole != RoleOperator && a.ProxyRole != RoleNone {
		errs = append(errs, fmt.Errorf("Auth.ProxyRole %q: want viewer, operator or none", a.ProxyRole))
	}
	for i, p := range a.TrustedProxies {
		if _, err := ParseTrustedProxy(p); err != nil {
			errs = append(errs, fmt.Errorf("Auth.TrustedProxies[%d]: %w", i, err))
		}
	}
	if strings.ContainsAny(a.Realm, "\"\\") || strings.ContainsFunc(a.Realm, unicode.IsControl) {
		errs = append(errs, fmt.Errorf("Auth.Realm %q: no quotes, backslashes or control characters", a.Realm))
	}
	return errs
}

// validHeaderName reports whether s is an HTTP field name (a token).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// reserved reports whether header name is one that a browser sets itself,
// which no proxy identity may be read from.
func reserved(name string) bool {
	switch http.CanonicalHeaderKey(name) {
	case "Authorization", "Cookie", "Host", "Origin", "Referer", "User-Agent", "Proxy-Authorization":
		return true
	}
	return false
}

// ParseTrustedProxy parses a trusted proxy's address: an IP address
// ("10.0.0.7", "::1"; it stands for itself alone) or a CIDR prefix
// ("10.0.0.0/8", "fd00::/8"). An IPv4 address written in IPv6 form
// ("::ffff:10.0.0.7") is its IPv4 address.
func ParseTrustedProxy(s string) (netip.Prefix, error) {
	t := strings.TrimSpace(s)
	if strings.Contains(t, "/") {
		p, err := netip.ParsePrefix(t)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("trusted proxy %q: not a CIDR prefix (want e.g. 10.0.0.0/8)", s)
		}
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(t)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("trusted proxy %q: not an IP address or CIDR prefix (want e.g. 10.0.0.7 or 10.0.0.0/8)", s)
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// identity is who makes a request.
type identity struct {
	// Name is the authenticated user: the actor of the actions. Empty
	// without authentication.
	Name string
	// Role is what the user may do. Without authentication, an operator:
	// anyone who reaches the console may act when it allows actions.
	Role Role
	// Method is how the user was authenticated: "proxy" or "basic"; ""
	// without authentication.
	Method string
}

// Authenticated reports whether the console knows who the user is.
func (i identity) Authenticated() bool { return i.Method != "" }

// MayAct reports whether the user may act (the console allowing it).
func (i identity) MayAct() bool { return i.Role == RoleOperator }

// whoKey is the context key of a request's identity. The identity is
// request-scoped: set by the console's authentication, read by its pages
// and actions, never outside the package.
type whoKey struct{}

// whoOf returns the identity of r that the console's authentication set.
func whoOf(r *http.Request) identity {
	who, _ := r.Context().Value(whoKey{}).(identity)
	return who
}

// authError is a request that does not authenticate: its status (401, or
// 403 for a user who has no role) and why.
type authError struct {
	status int
	err    error
}

func (e *authError) Error() string { return e.err.Error() }

func unauthorized(format string, args ...any) *authError {
	return &authError{status: http.StatusUnauthorized, err: fmt.Errorf(format, args...)}
}

// authenticator authenticates the console's requests.
type authenticator struct {
	cfg          AuthConfig
	proxies      []netip.Prefix
	proxyHeader  string // canonical; "" for none
	groupsHeader string // canonical; "" for none
	htpasswd     *htpasswd
	log          *slog.Logger
}

// newAuthenticator returns the authenticator of cfg (validated), reading
// its htpasswd file. One that authenticates nobody still knows the trusted
// proxies, for X-Forwarded-Proto.
func newAuthenticator(cfg AuthConfig, log *slog.Logger) (*authenticator, error) {
	a := &authenticator{cfg: cfg, log: log}
	for _, p := range cfg.TrustedProxies {
		prefix, err := ParseTrustedProxy(p)
		if err != nil {
			return nil, err
		}
		a.proxies = append(a.proxies, prefix)
	}
	if !cfg.enabled() {
		return a, nil
	}
	if cfg.ProxyHeader != "" {
		a.proxyHeader = http.CanonicalHeaderKey(cfg.ProxyHeader)
	}
	if cfg.ProxyGroupsHeader != "" {
		a.groupsHeader = http.CanonicalHeaderKey(cfg.ProxyGroupsHeader)
	}
	if cfg.HtpasswdFile != "" {
		h, err := loadHtpasswd(cfg.HtpasswdFile)
		if err != nil {
			return nil, fmt.Errorf("Auth.HtpasswdFile: %w", err)
		}
		a.htpasswd = h
	}
	return a, nil
}

// on reports whether the console authenticates.
func (a *authenticator) on() bool { return a.cfg.enabled() }

// trusted reports whether r comes from a trusted proxy: whether the
// address of the connection's peer is in TrustedProxies.
func (a *authenticator) trusted(r *http.Request) bool {
	return trustedAddr(a.proxies, r.RemoteAddr)
}

// trustedAddr reports whether remoteAddr ("host:port", as
// http.Request.RemoteAddr) is in one of prefixes.
func trustedAddr(prefixes []netip.Prefix, remoteAddr string) bool {
	if len(prefixes) == 0 {
		return false
	}
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	addr = addr.Unmap().WithZone("")
	for _, p := range prefixes {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// forwardedHTTPS reports whether r reached a trusted proxy over HTTPS, as
// the proxy says in X-Forwarded-Proto.
func (a *authenticator) forwardedHTTPS(r *http.Request) bool {
	if !a.trusted(r) {
		return false
	}
	proto, _, _ := strings.Cut(r.Header.Get("X-Forwarded-Proto"), ",")
	return strings.EqualFold(strings.TrimSpace(proto), "https")
}

// maxName is the longest user name the console accepts, in bytes.
const maxName = 256

// authenticate returns who makes r, or an *authError.
func (a *authenticator) authenticate(r *http.Request) (identity, error) {
	if !a.on() {
		return identity{Role: RoleOperator}, nil
	}
	if a.proxyHeader != "" {
		if vals := r.Header.Values(a.proxyHeader); len(vals) > 0 {
			if !a.trusted(r) {
				return identity{}, unauthorized("the identity header %s came from %s, which is not a trusted proxy (Auth.TrustedProxies): refused", a.proxyHeader, hostOf(r.RemoteAddr))
			}
			if len(vals) > 1 {
				return identity{}, unauthorized("the identity header %s came %d times: want one user", a.proxyHeader, len(vals))
			}
			name, err := userName(vals[0])
			if err != nil {
				return identity{}, unauthorized("the identity header %s: %w", a.proxyHeader, err)
			}
			role := a.proxyRole(r)
			if role == RoleNone {
				return identity{}, &authError{status: http.StatusForbidden,
					err: fmt.Errorf("%s has no role in this console: no group of theirs has one (Auth.GroupRoles), and users without are refused (Auth.ProxyRole none)", name)}
			}
			return identity{Name: name, Role: role, Method: "proxy"}, nil
		}
	}
	if a.htpasswd != nil {
		user, pass, ok := r.BasicAuth()
		if !ok {
			return identity{}, unauthorized("sign in: this console needs a user and a password")
		}
		role, ok, reload := a.htpasswd.authenticate(user, pass)
		a.logReload(reload)
		if !ok {
			a.log.Warn("console sign-in refused", "user", printable(user), "remote_addr", r.RemoteAddr)
			return identity{}, unauthorized("wrong user or password")
		}
		return identity{Name: user, Role: role, Method: "basic"}, nil
	}
	return identity{}, unauthorized("no identity: this console is reached through an authenticating proxy, which names the user in %s", a.proxyHeader)
}

// logReload logs what a look at the htpasswd file found, if anything.
func (a *authenticator) logReload(ev reloadEvent) {
	switch {
	case ev.err != nil:
		a.log.Error("console htpasswd file changed but cannot be read: the users read before stay", "path", a.cfg.HtpasswdFile, "err", ev.err)
	case ev.users > 0:
		a.log.Info("console htpasswd file reloaded", "path", a.cfg.HtpasswdFile, "users", ev.users)
	}
}

// proxyRole returns the role of r's proxied user: the highest that
// GroupRoles gives one of their groups, else ProxyRole.
func (a *authenticator) proxyRole(r *http.Request) Role {
	best := Role("")
	if a.groupsHeader != "" {
		for _, v := range r.Header.Values(a.groupsHeader) {
			for g := range strings.SplitSeq(v, ",") {
				if role, ok := a.cfg.GroupRoles[strings.TrimSpace(g)]; ok && role.rank() > best.rank() {
					best = role
				}
			}
		}
	}
	if best == "" {
		return a.cfg.ProxyRole
	}
	return best
}

// userName checks a user name from a header.
func userName(v string) (string, error) {
	name := strings.TrimSpace(v)
	switch {
	case name == "":
		return "", errors.New("empty: the proxy named no user")
	case len(name) > maxName:
		return "", fmt.Errorf("the user's name has %d bytes: at most %d", len(name), maxName)
	case !utf8.ValidString(name) || strings.ContainsFunc(name, unicode.IsControl):
		return "", errors.New("the user's name has control characters or is not UTF-8")
	}
	return name, nil
}

// printable returns s for a log line: at most maxName bytes, without
// control characters.
func printable(s string) string {
	if len(s) > maxName {
		s = s[:maxName]
	}
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return '?'
		}
		return r
	}, strings.ToValidUTF8(s, "?"))
}

// hostOf returns the host of remoteAddr ("host:port").
func hostOf(remoteAddr string) string {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		return remoteAddr
	}
	return host
}

// authenticate wraps next: a request that does not authenticate is
// answered 401 (with a basic-auth challenge when the console has users of
// its own) or 403; one that does goes on with its identity.
func (c *console) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		who, err := c.auth.authenticate(r)
		if err != nil {
			var ae *authError
			if !errors.As(err, &ae) {
				ae = &authError{status: http.StatusUnauthorized, err: err}
			}
			if ae.status == http.StatusUnauthorized && c.auth.htpasswd != nil {
				w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Basic realm="%s", charset="UTF-8"`, c.cfg.Auth.Realm))
			}
			c.fail(w, r, ae.status, ae)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), whoKey{}, who)))
	})
}
