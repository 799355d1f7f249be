package cli_test

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/cmd/sagabox/internal/cli"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/internal/testkit/servers"
	"github.com/sagabox/sagabox/store"
)

// withQuery returns rawURL with its query parameters set from kv pairs.
func withQuery(t *testing.T, rawURL string, kv ...string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	require.NoError(t, err)
	q := u.Query()
	for i := 0; i+1 < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// The CLI takes TLS from the URLs alone, as the clients do: PostgreSQL with
// sslmode=verify-full and a client certificate, RabbitMQ over amqps with
// one. A CA that did not issue the server's certificate fails with the
// host and the CA named; a TLS listener is never traded for plain text (a
// server without TLS, the plain AMQP port); a missing certificate file is
// a usage error that names it. No password appears in any of it.
func TestTLSConnections(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	certs, err := servers.NewCerts(t.TempDir(), "sagabox test CA", "postgres")
	require.NoError(t, err)
	other, err := servers.NewCerts(t.TempDir(), "some other CA", "postgres")
	require.NoError(t, err)
	pg, err := servers.StartPostgres(ctx, servers.PostgresOptions{TLS: &servers.PostgresTLS{Certs: certs, ClientCert: true}, Password: "Pw-tls-s3cret"})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, pg.Close()) })
	plainPG, err := servers.StartPostgres(ctx, servers.PostgresOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, plainPG.Close()) })
	node, err := servers.StartRabbitMQ(ctx, servers.RabbitMQOptions{TLS: &servers.RabbitMQTLS{Certs: certs, FailIfNoPeerCert: true}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, node.Close()) })

	pgHost := "127.0.0.1:" + strconv.Itoa(pg.Port())
	amqpHost := "127.0.0.1:" + strconv.Itoa(node.TLSPort())
	amqps := withQuery(t, node.TLSURL(),
		"cacertfile", certs.CAFile, "certfile", certs.ClientCertFile, "keyfile", certs.ClientKeyFile)
	noSecret := func(t *testing.T, r result) {
		t.Helper()
		require.NotContains(t, r.stdout+r.stderr, "Pw-tls-s3cret")
	}

	t.Run("both over TLS", func(t *testing.T) {
		r := runBroker(t, "--database-url", pg.URL(), "--schema", "tls_cli", "migrate", "up")
		require.Equal(t, cli.ExitOK, r.code, r.stderr)
		require.Contains(t, r.stdout, "applied messaging 1")
		r = runBroker(t, "--database-url", pg.URL(), "--schema", "tls_cli", "saga", "list")
		require.Equal(t, cli.ExitOK, r.code, r.stderr)
		r = runBroker(t, "dlq", "list", "--amqp-url", amqps, "--namespace", "tls", "--queue", "inventory")
		require.Equal(t, cli.ExitOK, r.code, r.stderr)
	})
	t.Run("PostgreSQL: wrong CA", func(t *testing.T) {
		t.Parallel()
		r := runBroker(t, "--database-url", withQuery(t, pg.URL(), "sslrootcert", other.CAFile), "saga", "list")
		require.Equal(t, cli.ExitError, r.code, r.stderr)
		for _, want := range []string{
			"the certificate of PostgreSQL at " + pgHost,
			"issued by sagabox test CA",
			"does not verify against the CA in sslrootcert=" + other.CAFile + " (some other CA)",
			"set sslrootcert to the CA that issued it",
		} {
			require.Contains(t, r.stderr, want)
		}
		noSecret(t, r)
	})
	t.Run("PostgreSQL: no TLS is refused, not used", func(t *testing.T) {
		t.Parallel()
		r := runBroker(t, "--database-url", withQuery(t, pg.URL(), "sslmode", "disable"), "saga", "list")
		require.Equal(t, cli.ExitError, r.code, r.stderr)
		require.Contains(t, r.stderr, "pg_hba.conf")
		noSecret(t, r)
		r = runBroker(t, "--database-url", withQuery(t, plainPG.URL(), "sslmode", "verify-full", "sslrootcert", certs.CAFile), "saga", "list")
		require.Equal(t, cli.ExitError, r.code, r.stderr)
		require.Contains(t, r.stderr, "server refused TLS connection")
	})
	t.Run("PostgreSQL: missing certificate file", func(t *testing.T) {
		t.Parallel()
		missing := filepath.Join(t.TempDir(), "ca.pem")
		r := runBroker(t, "--database-url", withQuery(t, pg.URL(), "sslrootcert", missing), "saga", "list")
		require.Equal(t, cli.ExitUsage, r.code, r.stderr)
		require.Contains(t, r.stderr, missing+": no such file or directory")
		require.Contains(t, r.stderr, "postgres://postgres:***@"+pgHost)
		noSecret(t, r)
	})
	t.Run("RabbitMQ: wrong CA", func(t *testing.T) {
		t.Parallel()
		u := strings.Replace(withQuery(t, amqps, "cacertfile", other.CAFile), "guest:guest", "guest:Pw-tls-s3cret", 1)
		r := runBroker(t, "dlq", "list", "--amqp-url", u, "--queue", "inventory")
		require.Equal(t, cli.ExitError, r.code, r.stderr)
		require.Contains(t, r.stderr, "the certificate of the broker at "+amqpHost)
		require.Contains(t, r.stderr, "does not verify against the CA in cacertfile="+other.CAFile+" (some other CA)")
		noSecret(t, r)
	})
	t.Run("RabbitMQ: the plain port is refused, not used", func(t *testing.T) {
		t.Parallel()
		u := strings.Replace(amqps, amqpHost, "127.0.0.1:"+strconv.Itoa(node.Port()), 1)
		r := runBroker(t, "dlq", "list", "--amqp-url", u, "--queue", "inventory")
		require.Equal(t, cli.ExitError, r.code, r.stderr)
		require.Contains(t, r.stderr, "does not speak TLS")
	})
}

// `sagabox roles print` prints grants that, run as the owner, give a role
// exactly its part: the runtime role inspects and acts, the read-only
// role inspects and serves the read-only console, and a role without the
// grants is told which it lacks and the command that prints them.
func TestRolesPrint(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := dbtest.Store(t)
	schema := db.Store.Schema()
	sagaIn(t, db, "running", 1, twoSteps, "", "order-1")
	runtime, readOnly, none := dbtest.Role(t, db.Pool), dbtest.Role(t, db.Pool), dbtest.Role(t, db.Pool)

	r := run(t, "--schema", schema, "roles", "print", "--role", runtime)
	require.Equal(t, cli.ExitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, fmt.Sprintf(`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA %q TO %q;`, schema, runtime))
	_, err := db.Pool.Exec(ctx, r.stdout)
	require.NoError(t, err, r.stdout)
	r = run(t, "--schema", schema, "roles", "print", "--role", readOnly, "--read-only")
	require.Equal(t, cli.ExitOK, r.code, r.stderr)
	_, err = db.Pool.Exec(ctx, r.stdout)
	require.NoError(t, err, r.stdout)

	as := func(role string, args ...string) result {
		return runBroker(t, append([]string{"--database-url", dbtest.URLAs(t, role), "--schema", schema}, args...)...)
	}
	for _, role := range []string{runtime, readOnly} {
		r := as(role, "saga", "list")
		require.Equal(t, cli.ExitOK, r.code, "%s: %s", role, r.stderr)
		require.Contains(t, r.stdout, "checkout")
	}
	r = as(none, "saga", "list")
	require.Equal(t, cli.ExitError, r.code)
	require.Contains(t, r.stderr, "permission denied")
	require.Contains(t, r.stderr, fmt.Sprintf("sagabox roles print --schema %s --role %s --read-only", schema, none))

	// The read-only role's writes are refused, with the runtime role's
	// grants named; the migrations are the owner's alone.
	r = as(readOnly, "migrate", "up")
	require.Equal(t, cli.ExitError, r.code)
	require.True(t, strings.Contains(r.stderr, "permission denied"), r.stderr)
	r = as(runtime, "migrate", "up")
	require.Equal(t, cli.ExitError, r.code, "a runtime role creates nothing")

	r = run(t, "roles", "print")
	require.Equal(t, cli.ExitUsage, r.code)
	require.Contains(t, r.stderr, "role is required")
	r = run(t, "roles", "print", "--role", "r", "--read-only", "--log-relay")
	require.Equal(t, cli.ExitUsage, r.code)
}

// The console started read-only by a role without its grants refuses to
// start, with the GRANTs it lacks, in its schema and in each messaging
// schema it shows.
func TestUIChecksThePrivileges(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := dbtest.Store(t)
	participant := dbtest.StoreOnPool(t, db.Pool, store.LineMessaging)
	role := dbtest.Role(t, db.Pool)
	ui := func() result {
		return runBroker(t, "--database-url", dbtest.URLAs(t, role), "--schema", db.Store.Schema(), "ui", "--addr", "127.0.0.1:0",
			"--messaging-schema", participant.Store.Schema())
	}
	r := ui()
	require.Equal(t, cli.ExitError, r.code)
	require.Contains(t, r.stderr, "lacks what a read-only role needs")
	require.Contains(t, r.stderr, fmt.Sprintf(`GRANT SELECT ON %q."sagabox_saga_v" TO %q`, db.Store.Schema(), role))
	require.Contains(t, r.stderr, "--read-only")

	sql, err := store.GrantsSQL(store.GrantOpts{Schema: db.Store.Schema(), Role: role, PrivilegeOpts: store.PrivilegeOpts{ReadOnly: true}})
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, sql)
	require.NoError(t, err)
	r = ui()
	require.Equal(t, cli.ExitError, r.code)
	require.Contains(t, r.stderr, fmt.Sprintf(`GRANT USAGE ON SCHEMA %q TO %q`, participant.Store.Schema(), role))
}
