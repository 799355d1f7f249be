package store_test

import (
	"math/rand/v2"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/store"
)

// RedactConnString shows a connection string's host, user, database and
// settings, and never its password or sslpassword, in either form.
func TestRedactConnString(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"postgres://app:s3cret@db.internal:5432/shop?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem": "postgres://app:***@db.internal:5432/shop?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem",
		"postgres://app@db.internal/shop":                                            "postgres://app@db.internal/shop",
		"postgresql://app@db/shop?password=s3cret&sslpassword=k3y":                   "postgresql://app@db/shop?password=***&sslpassword=***",
		"host=db user=app password=s3cret dbname=shop":                               "host=db user=app password=*** dbname=shop",
		"host=db password = 'it''s s3cret' sslpassword='k\\'3y' sslmode=verify-full": "",
		"host=db password='s3 cr\\'et' sslmode=verify-full":                          "host=db password=*** sslmode=verify-full",
		"postgres://app:s3cret@db:x/shop":                                            "(a PostgreSQL URL that cannot be parsed; not shown, it may hold a password)",
		"host=db password='s3cret":                                                   "(a PostgreSQL connection string that cannot be parsed; not shown, it may hold a password)",
	} {
		got := store.RedactConnString(in)
		require.NotContains(t, got, "s3", in)
		require.NotContains(t, got, "k3y", in)
		if want != "" {
			require.Equal(t, want, got, in)
		}
	}
}

// Random passwords of every character a password may hold, in a URL
// (escaped as net/url escapes them) and in the keyword/value form (quoted as
// libpq quotes them), never survive RedactConnString, and what it returns
// still parses as the same connection with another password.
func TestRedactConnStringrandomPasswords(t *testing.T) {
	t.Parallel()
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, seed))
	for range 500 {
		pw := randomPassword(r)
		u := url.URL{Scheme: "postgres", User: url.UserPassword("app", pw), Host: "db.internal:5432", Path: "/shop", RawQuery: "sslmode=verify-full"}
		dsn := "host=db.internal user=app password='" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(pw) + "' dbname=shop"
		for _, in := range []string{u.String(), dsn} {
			cfg, err := pgx.ParseConfig(in)
			require.NoError(t, err, "the test's own string parses")
			require.Equal(t, pw, cfg.Password)
			got := store.RedactConnString(in)
			for _, form := range passwordForms(pw) {
				require.NotContains(t, got, form, "password %q in %q", pw, in)
			}
			red, err := pgx.ParseConfig(got)
			require.NoError(t, err, got)
			require.Equal(t, "app", red.User)
			require.Equal(t, "db.internal", red.Host)
			require.Equal(t, "shop", red.Database)
		}
	}
}

// passwordRunes are what randomPassword draws from: letters, digits, every
// character that needs escaping in a URL or quoting in a keyword/value
// string, and some beyond ASCII.
var passwordRunes = []rune("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 !\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~äé€😀")

// randomPassword returns a password of 16 to 32 characters that starts
// with a marker no message would hold by chance.
func randomPassword(r *rand.Rand) string {
	n := 16 + r.IntN(17)
	b := []rune("Pw")
	for range n {
		b = append(b, passwordRunes[r.IntN(len(passwordRunes))])
	}
	return string(b)
}

// passwordForms are the ways pw may appear in a message: as is, and as
// URLs escape it.
func passwordForms(pw string) []string {
	return []string{pw, url.QueryEscape(pw), url.PathEscape(pw), url.UserPassword("u", pw).String()[2:]}
}
