// Package secrettest helps tests show that a password never leaks: random
// passwords made of every character that needs escaping in a URL or
// quoting in a PostgreSQL keyword/value string, the URLs and connection
// strings that carry them, escaped as their clients expect, and a check
// that a text holds a password in none of the forms it could take.
package secrettest

import (
	"math/rand/v2"
	"net/url"
	"strings"
	"testing"
)

// Runes are what Password draws from: letters, digits, every ASCII
// punctuation character and some beyond ASCII.
const Runes = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 !\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~äé€😀"

// ASCII are the printable ASCII characters but the space, '$', '`' and
// '\', for passwords a server's command-line tool must take: Debian's
// rabbitmqctl wrapper passes its arguments to sh inside double quotes,
// where those three still mean something.
const ASCII = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!\"#%&'()*+,-./:;<=>?@[]^_{|}~"

// Rand returns a random source seeded at random, and logs the seed so that
// a failure can be replayed.
func Rand(t testing.TB) *rand.Rand {
	seed := rand.Uint64()
	t.Logf("secrettest seed %d", seed)
	return rand.New(rand.NewPCG(seed, seed))
}

// Password returns a password of 16 to 32 characters of runes after the
// prefix "Pw", which no message holds by chance and which no tool takes
// for an option.
func Password(r *rand.Rand, runes string) string {
	rs := []rune(runes)
	b := []rune("Pw")
	for range 16 + r.IntN(17) {
		b = append(b, rs[r.IntN(len(rs))])
	}
	return string(b)
}

// URL returns scheme://user:password@host/path with the user information
// and the path escaped as net/url escapes them, and query as the query.
func URL(scheme, user, password, host, path, query string) string {
	u := url.URL{Scheme: scheme, User: url.UserPassword(user, password), Host: host, Path: path, RawQuery: query}
	return u.String()
}

// Quote quotes v as a value of PostgreSQL's keyword/value form.
func Quote(v string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}

// Forms are the ways password may appear in a text: as it is, and as URLs
// and Go's %q escape it.
func Forms(password string) []string {
	forms := []string{password, url.QueryEscape(password), url.PathEscape(password), url.UserPassword("u", password).String()[2:]}
	if q := strings.Trim(strings.ReplaceAll(strings.ReplaceAll(password, `\`, `\\`), `"`, `\"`), `"`); q != password {
		forms = append(forms, q)
	}
	return forms
}

// NoLeak fails t when text holds password in any of its Forms.
func NoLeak(t testing.TB, text, password, what string) {
	t.Helper()
	for _, f := range Forms(password) {
		if strings.Contains(text, f) {
			t.Errorf("%s shows the password %q (as %q):\n%s", what, password, f, text)
			return
		}
	}
}
