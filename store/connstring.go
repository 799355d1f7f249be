package store

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5/pgconn"
)

// Connection strings: pgx takes a URL (postgres://user:password@host/db?
// sslmode=verify-full&sslrootcert=/path/ca.pem) or libpq's keyword/value
// form (host=… user=… password=… sslmode=…). sagabox passes them to pgx
// untouched, TLS settings included; these helpers only read them, to show
// one without its secrets and to say which CA a failed TLS connection was
// checked against.

// secretKeys are the connection settings whose values are secrets.
var secretKeys = map[string]bool{"password": true, "sslpassword": true}

// redacted replaces a secret in a connection string shown to a person.
const redacted = "***"

// RedactConnString returns connString, a PostgreSQL URL or keyword/value
// connection string, fit to show in a log line or an error: the password
// in a URL's user information and the values of password and sslpassword
// (in a URL's query or as keywords) are replaced by "***". A string that
// cannot be parsed is not shown at all: it is replaced by a note saying so,
// since a password in it cannot be found for certain.
func RedactConnString(connString string) string {
	if isURL(connString) {
		u, err := url.Parse(connString)
		if err != nil {
			return "(a PostgreSQL URL that cannot be parsed; not shown, it may hold a password)"
		}
		if u.User != nil {
			if _, has := u.User.Password(); has {
				u.User = url.UserPassword(u.User.Username(), redacted)
			}
		}
		if q := u.Query(); q.Has("password") || q.Has("sslpassword") {
			for k := range secretKeys {
				if q.Has(k) {
					q.Set(k, redacted)
				}
			}
			u.RawQuery = q.Encode()
		}
		// The URL's encoding writes each * as %2A.
		return strings.ReplaceAll(u.String(), "%2A%2A%2A", redacted)
	}
	pairs, err := keywordValues(connString)
	if err != nil {
		return "(a PostgreSQL connection string that cannot be parsed; not shown, it may hold a password)"
	}
	var b strings.Builder
	for i, kv := range pairs {
		if i > 0 {
			b.WriteByte(' ')
		}
		v := kv[1]
		if secretKeys[kv[0]] {
			v = redacted
		}
		b.WriteString(kv[0] + "=" + quoteValue(v))
	}
	return b.String()
}

func isURL(s string) bool {
	return strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://")
}

// keywordValues parses libpq's keyword/value form: keyword = value pairs
// separated by white space, a value in single quotes with \' and \\ for
// a quote and a backslash, or bare up to white space (backslash escapes
// too).
func keywordValues(s string) ([][2]string, error) {
	var out [][2]string
	for {
		s = strings.TrimLeftFunc(s, unicode.IsSpace)
		if s == "" {
			return out, nil
		}
		eq := strings.IndexByte(s, '=')
		if eq <= 0 {
			return nil, errors.New("keyword without a value")
		}
		key := strings.TrimRightFunc(s[:eq], unicode.IsSpace)
		if strings.IndexFunc(key, unicode.IsSpace) >= 0 {
			return nil, errors.New("keyword with white space")
		}
		s = strings.TrimLeftFunc(s[eq+1:], unicode.IsSpace)
		var val strings.Builder
		if strings.HasPrefix(s, "'") {
			s = s[1:]
			closed := false
			for len(s) > 0 && !closed {
				switch c := s[0]; {
				case c == '\\' && len(s) > 1:
					val.WriteByte(s[1])
					s = s[2:]
				case c == '\'':
					closed = true
					s = s[1:]
				default:
					val.WriteByte(c)
					s = s[1:]
				}
			}
			if !closed {
				return nil, errors.New("unterminated quoted value")
			}
		} else {
			for len(s) > 0 && !unicode.IsSpace(rune(s[0])) {
				if s[0] == '\\' && len(s) > 1 {
					val.WriteByte(s[1])
					s = s[2:]
					continue
				}
				val.WriteByte(s[0])
				s = s[1:]
			}
		}
		out = append(out, [2]string{key, val.String()})
	}
}

// quoteValue quotes v for the keyword/value form when it needs quotes.
func quoteValue(v string) string {
	if v != "" && !strings.ContainsAny(v, " \t\n\r'\\") {
		return v
	}
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}

// connSetting returns the value of key in connString, or of its
// environment variable (env) when the string does not set it, as pgx
// reads them.
func connSetting(connString, key, env string) string {
	if isURL(connString) {
		if u, err := url.Parse(connString); err == nil && u.Query().Has(key) {
			return u.Query().Get(key)
		}
	} else if pairs, err := keywordValues(connString); err == nil {
		for i := len(pairs) - 1; i >= 0; i-- {
			if pairs[i][0] == key {
				return pairs[i][1]
			}
		}
	}
	return os.Getenv(env)
}

// trustedCAs says which CAs a connection made with connString checks the
// server's certificate against, as pgx does: the file of sslrootcert, or
// the system's trusted CAs.
func trustedCAs(connString string) string {
	root := connSetting(connString, "sslrootcert", "PGSSLROOTCERT")
	switch root {
	case "":
		return "the system's trusted CAs (the connection string sets no sslrootcert)"
	case "system":
		return "the system's trusted CAs (sslrootcert=system)"
	}
	b, err := os.ReadFile(root)
	if err != nil {
		return fmt.Sprintf("the CA in sslrootcert=%s", root)
	}
	var names []string
	for rest := b; ; {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			break
		}
		if c, err := x509.ParseCertificate(block.Bytes); err == nil {
			names = append(names, certName(c))
		}
	}
	if len(names) == 0 {
		return fmt.Sprintf("the CA in sslrootcert=%s", root)
	}
	return fmt.Sprintf("the CA in sslrootcert=%s (%s)", root, strings.Join(names, ", "))
}

// issuerName names the CA that issued c.
func issuerName(c *x509.Certificate) string {
	if c.Issuer.CommonName != "" {
		return c.Issuer.CommonName
	}
	return c.Issuer.String()
}

func certName(c *x509.Certificate) string {
	if c.Subject.CommonName != "" {
		return c.Subject.CommonName
	}
	return c.Subject.String()
}

// isCertificateError reports whether err says a server's certificate did
// not verify: signed by an unknown authority, for another host name, or
// not valid (expired, not yet valid, not for server authentication).
func isCertificateError(err error) bool {
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	var verify *tls.CertificateVerificationError
	return errors.As(err, &unknown) || errors.As(err, &host) || errors.As(err, &invalid) || errors.As(err, &verify)
}

// ExplainCertificate returns err, a failed connection to PostgreSQL with
// connString, as an error that says which server's certificate did not
// verify, against which CA, and what to do, when that is its cause
// (ClassifyConnect says ConnectCertificate); other errors are returned as
// they are. The message never holds the password, and the result wraps
// err.
func ExplainCertificate(connString string, err error) error {
	if !isCertificateError(err) {
		return err
	}
	host := "the server"
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) && connectErr.Config != nil {
		host = net.JoinHostPort(connectErr.Config.Host, strconv.Itoa(int(connectErr.Config.Port)))
	}
	cas := trustedCAs(connString)
	var unknown x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	var invalid x509.CertificateInvalidError
	var what string
	cause := err
	switch {
	case errors.As(err, &unknown):
		cause = unknown
		issuer := ""
		if unknown.Cert != nil {
			issuer = fmt.Sprintf(" (issued by %s)", issuerName(unknown.Cert))
		}
		what = fmt.Sprintf("the certificate of PostgreSQL at %s%s does not verify against %s: set sslrootcert to the CA that issued it", host, issuer, cas)
	case errors.As(err, &hostErr):
		cause = hostErr
		names := "no host names"
		if hostErr.Certificate != nil {
			all := append([]string{}, hostErr.Certificate.DNSNames...)
			for _, ip := range hostErr.Certificate.IPAddresses {
				all = append(all, ip.String())
			}
			names = strings.Join(all, ", ")
		}
		what = fmt.Sprintf("the certificate of PostgreSQL at %s (verified against %s) is for %s, not for %q: connect with a host name the certificate holds (sslmode=verify-full checks it), or reissue it with that name", host, cas, names, hostErr.Host)
	case errors.As(err, &invalid):
		cause = invalid
		validity := ""
		if invalid.Cert != nil {
			validity = fmt.Sprintf(" (valid from %s to %s)", invalid.Cert.NotBefore.UTC().Format(time.RFC3339), invalid.Cert.NotAfter.UTC().Format(time.RFC3339))
		}
		what = fmt.Sprintf("the certificate of PostgreSQL at %s is not valid%s, checked against %s: renew it", host, validity, cas)
	default:
		what = fmt.Sprintf("the certificate of PostgreSQL at %s does not verify against %s", host, cas)
	}
	return &explainedError{msg: "TLS: " + what + " (" + cause.Error() + ")", err: err}
}

// explainedError is an error with a message of its own for a person, that
// still wraps the error it explains.
type explainedError struct {
	msg string
	err error
}

func (e *explainedError) Error() string { return e.msg }
func (e *explainedError) Unwrap() error { return e.err }

// ExplainParseError returns err, pgx's error of parsing connString, as an
// error fit to show: the problem (a file named by sslrootcert, sslcert or
// sslkey that cannot be read, a setting with a wrong value) without the
// connection string, whose password pgx's text may hold when the string is
// malformed. It wraps err.
func ExplainParseError(connString string, err error) error {
	var pce *pgconn.ParseConfigError
	if !errors.As(err, &pce) {
		return err
	}
	var urlErr *url.Error
	inner := pce.Unwrap()
	if inner == nil || errors.As(inner, &urlErr) {
		return &explainedError{msg: "not a valid PostgreSQL URL or keyword/value connection string: " + RedactConnString(connString), err: err}
	}
	return &explainedError{msg: "connection string " + RedactConnString(connString) + ": " + inner.Error(), err: err}
}
