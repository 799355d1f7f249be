package store_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit/secrettest"
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
	r := secrettest.Rand(t)
	for range 500 {
		pw := secrettest.Password(r, secrettest.Runes)
		dsn := "host=db.internal user=app password=" + secrettest.Quote(pw) + " dbname=shop"
		for _, in := range []string{secrettest.URL("postgres", "app", pw, "db.internal:5432", "/shop", "sslmode=verify-full"), dsn} {
			cfg, err := pgx.ParseConfig(in)
			require.NoError(t, err, "the test's own string parses")
			require.Equal(t, pw, cfg.Password)
			got := store.RedactConnString(in)
			secrettest.NoLeak(t, got, pw, "RedactConnString("+in+")")
			red, err := pgx.ParseConfig(got)
			require.NoError(t, err, got)
			require.Equal(t, "app", red.User)
			require.Equal(t, "db.internal", red.Host)
			require.Equal(t, "shop", red.Database)
		}
	}
}
