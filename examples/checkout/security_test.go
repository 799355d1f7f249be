package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/examples/checkout/contract"
	"github.com/sagabox/sagabox/examples/checkout/inventory"
	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/internal/testkit/secrettest"
	"github.com/sagabox/sagabox/internal/testkit/servers"
	"github.com/sagabox/sagabox/participant"
	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

// setQuery returns rawURL with the query parameters of kv pairs set.
func setQuery(t *testing.T, rawURL string, kv ...string) string {
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

// The example end to end over TLS to both servers, which the test
// configures with a CA of its own: PostgreSQL with sslmode=verify-full and
// a client certificate (the server takes TCP connections over TLS only and
// asks every client for its certificate), RabbitMQ over amqps with a client
// certificate (the node refuses clients without one). Every saga ends as
// planned. With a CA that did not issue a server's certificate, or amqps
// against the plain AMQP port, the example and the clients refuse to start
// and say which host and which CA; nothing goes out in plain text.
func TestCheckoutOverTLS(t *testing.T) {
	t.Parallel()
	// The subtests run after this function returns: the context lasts as
	// long as the test.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	certs, err := servers.NewCerts(t.TempDir(), "checkout test CA", "postgres")
	require.NoError(t, err)
	other, err := servers.NewCerts(t.TempDir(), "some other CA", "postgres")
	require.NoError(t, err)
	var pg *servers.Postgres
	var node *servers.RabbitMQ
	var wg sync.WaitGroup
	var pgErr, nodeErr error
	wg.Add(2)
	go func() {
		defer wg.Done()
		pg, pgErr = servers.StartPostgres(ctx, servers.PostgresOptions{TLS: &servers.PostgresTLS{Certs: certs, ClientCert: true}, Password: "Pw-checkout-tls"})
	}()
	go func() {
		defer wg.Done()
		node, nodeErr = servers.StartRabbitMQ(ctx, servers.RabbitMQOptions{TLS: &servers.RabbitMQTLS{Certs: certs, FailIfNoPeerCert: true}})
	}()
	wg.Wait()
	if pg != nil {
		t.Cleanup(func() { require.NoError(t, pg.Close()) })
	}
	if node != nil {
		t.Cleanup(func() { require.NoError(t, node.Close()) })
	}
	require.NoError(t, pgErr)
	require.NoError(t, nodeErr)

	databaseURL := pg.URL()
	amqpURL := setQuery(t, node.TLSURL(), "cacertfile", certs.CAFile, "certfile", certs.ClientCertFile, "keyfile", certs.ClientKeyFile)
	pgHost := "127.0.0.1:" + strconv.Itoa(pg.Port())
	brokerHost := "127.0.0.1:" + strconv.Itoa(node.TLSPort())

	var out, errOut bytes.Buffer
	code := run(ctx, []string{"-database-url", databaseURL, "-amqp-url", amqpURL, "-orders", "12", "-fail-rate", "0.5"}, &out, &errOut)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out.String(), errOut.String())
	s := parseSummary(t, out.String())
	require.Equal(t, summary{sagas: 12, completed: s.completed, compensated: 12 - s.completed}, s)
	require.Positive(t, s.completed)
	require.Positive(t, s.compensated)
	require.Contains(t, out.String(), "invariants: OK")

	refused := func(t *testing.T, args []string, want ...string) {
		t.Helper()
		var out, errOut bytes.Buffer
		code := run(ctx, append(args, "-orders", "1"), &out, &errOut)
		require.Equal(t, 1, code, "stdout:\n%s\nstderr:\n%s", out.String(), errOut.String())
		for _, w := range want {
			require.Contains(t, errOut.String(), w)
		}
		require.NotContains(t, errOut.String()+out.String(), "Pw-checkout-tls")
	}
	t.Run("PostgreSQL: wrong CA", func(t *testing.T) {
		t.Parallel()
		refused(t, []string{"-database-url", setQuery(t, databaseURL, "sslrootcert", other.CAFile), "-amqp-url", amqpURL},
			"the certificate of PostgreSQL at "+pgHost, "issued by checkout test CA",
			"does not verify against the CA in sslrootcert="+other.CAFile+" (some other CA)")
	})
	t.Run("RabbitMQ: wrong CA", func(t *testing.T) {
		t.Parallel()
		refused(t, []string{"-database-url", databaseURL, "-amqp-url", setQuery(t, amqpURL, "cacertfile", other.CAFile)},
			"the certificate of the broker at "+brokerHost, "issued by checkout test CA",
			"does not verify against the CA in cacertfile="+other.CAFile+" (some other CA)")
	})
	t.Run("RabbitMQ: amqps to the plain port", func(t *testing.T) {
		t.Parallel()
		refused(t, []string{"-database-url", databaseURL, "-amqp-url", strings.Replace(amqpURL, brokerHost, "127.0.0.1:"+strconv.Itoa(node.Port()), 1)},
			"does not speak TLS")
	})
	t.Run("RabbitMQ: TLS files on amqp://", func(t *testing.T) {
		t.Parallel()
		plain := strings.Replace(strings.Replace(amqpURL, "amqps://", "amqp://", 1), brokerHost, "127.0.0.1:"+strconv.Itoa(node.Port()), 1)
		refused(t, []string{"-database-url", databaseURL, "-amqp-url", plain}, "need an amqps:// URL: amqp:// is plain text")
	})
	t.Run("a client with the wrong CA", func(t *testing.T) {
		t.Parallel()
		// A program's own pool: the client's start-up check is its first
		// connection, and it says which host and which CA.
		pool, err := pgxpool.New(ctx, setQuery(t, databaseURL, "sslrootcert", other.CAFile))
		require.NoError(t, err)
		defer pool.Close()
		b, err := rabbitmq.New(ctx, rabbitmq.Config{URL: amqpURL, Namespace: "tls-client"})
		require.NoError(t, err)
		defer func() { _ = b.Close() }()
		c, err := participant.NewClient(participant.Config{Pool: pool, Broker: b, Schema: contract.ServiceInventory, Service: contract.ServiceInventory})
		require.NoError(t, err)
		inventory.New(contract.ServiceInventory).Register(c)
		err = c.Run(ctx)
		require.Error(t, err)
		require.Contains(t, err.Error(), "the certificate of PostgreSQL at "+pgHost)
		require.Contains(t, err.Error(), "does not verify against the CA in sslrootcert="+other.CAFile)
	})
}

// The example with every service under its own runtime role, made from
// `sagabox roles print`'s grants (store.GrantsSQL) by the test and dropped
// after it: the schemas are set up by the owner (-setup-only), each service
// runs as its role (-setup=false), and every saga ends as planned, the
// invariants checked by an auditor that may read every schema. A role
// cannot read another service's tables (42501), and a role that lacks its
// grants is refused at start with the GRANTs it lacks.
func TestCheckoutUnderRuntimeRoles(t *testing.T) {
	t.Parallel()
	common := isolated(t)
	runUnderRoles(t, dbtest.Pool(t), dbtest.URL(), common, common[3], "poll")
}

// The same with every relay in log mode, on a private cluster with
// wal_level = logical: the owner creates the publications and slots
// (-setup-only), the runtime roles get REPLICATION (GrantOpts.LogRelay) and
// stream from them; a role without it is refused at start with the ALTER
// ROLE it needs.
func TestCheckoutUnderRuntimeRolesWithLogRelay(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg, err := servers.StartPostgres(ctx, servers.PostgresOptions{Settings: map[string]string{"wal_level": "logical"}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, pg.Close()) })
	owner, err := pgxpool.New(ctx, pg.URL())
	require.NoError(t, err)
	t.Cleanup(owner.Close)
	common := append([]string{"-database-url", pg.URL(), "-schema-prefix", "roles_"}, isolatedQueues(t)...)
	runUnderRoles(t, owner, pg.URL(), common, "roles_", "log")
}

// urlAs returns base with role as its user.
func urlAs(t *testing.T, base, role string) string {
	t.Helper()
	u, err := url.Parse(base)
	require.NoError(t, err)
	u.User = url.User(role)
	return u.String()
}

// runUnderRoles runs the example with every service as a runtime role of
// its own on the database of baseURL (owner: a pool there as the owner),
// with common flags, schemas named prefix+service and the relay in
// relayMode.
func runUnderRoles(t *testing.T, owner *pgxpool.Pool, baseURL string, common []string, prefix, relayMode string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	logRelay := relayMode == "log"
	common = append(append([]string{}, common...), "-relay-mode", relayMode, "-v")

	var out, errOut bytes.Buffer
	require.Equal(t, 0, run(ctx, append(common, "-setup-only"), &out, &errOut), "setup:\n%s\n%s", out.String(), errOut.String())
	roles := map[string]string{}
	for _, svc := range services {
		roles[svc] = dbtest.Role(t, owner)
		sql, err := store.GrantsSQL(store.GrantOpts{Schema: prefix + svc, Role: roles[svc], PrivilegeOpts: store.PrivilegeOpts{LogRelay: logRelay}})
		require.NoError(t, err)
		_, err = owner.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}

	// A service reads its own tables, and no other service's.
	asInventory, err := pgxpool.New(ctx, urlAs(t, baseURL, roles["inventory"]))
	require.NoError(t, err)
	defer asInventory.Close()
	var n int
	require.NoError(t, asInventory.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %q.stock`, prefix+"inventory")).Scan(&n))
	for _, sql := range []string{
		fmt.Sprintf(`SELECT count(*) FROM %q.charge`, prefix+"payment"),
		fmt.Sprintf(`SELECT count(*) FROM %q.sagabox_outbox`, prefix+"payment"),
		fmt.Sprintf(`SELECT count(*) FROM %q.sagabox_saga`, prefix+"orders"),
		fmt.Sprintf(`CREATE TABLE %q.mine (n int)`, prefix+"inventory"),
	} {
		_, err := asInventory.Exec(ctx, sql)
		require.True(t, store.IsInsufficientPrivilege(err), "%s: %v", sql, err)
	}

	// A role without its grants is refused at start, with what it lacks;
	// with the runtime grants but no REPLICATION, a log relay's role is
	// told to get it.
	stranger := dbtest.Role(t, owner)
	if logRelay {
		sql, err := store.GrantsSQL(store.GrantOpts{Schema: prefix + "shipping", Role: stranger})
		require.NoError(t, err)
		_, err = owner.Exec(ctx, sql)
		require.NoError(t, err)
	}
	out.Reset()
	errOut.Reset()
	code := run(ctx, append(append([]string{}, common...), "-service", "shipping", "-setup=false", "-database-url", urlAs(t, baseURL, stranger)), &out, &errOut)
	require.Equal(t, 1, code, errOut.String())
	if logRelay {
		require.Contains(t, errOut.String(), fmt.Sprintf(`ALTER ROLE %q REPLICATION`, stranger))
		require.NotContains(t, errOut.String(), "GRANT ")
	} else {
		require.Contains(t, errOut.String(), fmt.Sprintf(`GRANT USAGE ON SCHEMA %q TO %q`, prefix+"shipping", stranger))
		require.Contains(t, errOut.String(), fmt.Sprintf(`GRANT SELECT, INSERT, UPDATE, DELETE ON %q."sagabox_outbox" TO %q`, prefix+"shipping", stranger))
	}

	runID := "roles" + dbtest.SchemaName(t)[2:8]
	webhook := freeAddr(t)
	args := func(svc string) []string {
		return append(append([]string{}, common...), "-service", svc, "-setup=false", "-run-id", runID, "-orders", "16", "-fail-rate", "0.5",
			"-database-url", urlAs(t, baseURL, roles[svc]), "-webhook-addr", webhook, "-webhook-url", "http://"+webhook+"/webhooks/payment")
	}
	participants, stop := context.WithCancel(ctx)
	defer stop()
	var running sync.WaitGroup
	logs := map[string]*testkit.Buffer{}
	for _, svc := range services[1:] {
		var buf testkit.Buffer
		logs[svc] = &buf
		done := make(chan int, 1)
		running.Add(1)
		go func() {
			defer running.Done()
			done <- run(participants, args(svc), &buf, &buf)
		}()
		t.Cleanup(func() {
			stop()
			select {
			case code := <-done:
				require.Equal(t, 0, code, "%s:\n%s", svc, buf.String())
			case <-time.After(time.Minute):
				t.Errorf("%s did not stop", svc)
			}
		})
		require.Eventually(t, func() bool { return strings.Contains(buf.String(), "service running") },
			time.Minute, 20*time.Millisecond, "%s did not start:\n%s", svc, buf.String())
	}
	var ordersOut testkit.Buffer
	code = run(ctx, append(args("orders"), "-audit-database-url", baseURL), &ordersOut, &ordersOut)
	require.Equal(t, 0, code, ordersOut.String())
	s := parseSummary(t, ordersOut.String())
	require.Equal(t, summary{sagas: 16, completed: s.completed, compensated: 16 - s.completed}, s, ordersOut.String())
	require.Positive(t, s.completed)
	require.Positive(t, s.compensated)
	require.Contains(t, ordersOut.String(), "invariants: OK")
	if logRelay {
		// Each relay streamed from its slot as its role: REPLICATION was
		// what it needed, and enough.
		logs["orders"] = &ordersOut
		for svc, buf := range logs {
			require.Contains(t, buf.String(), "relay reading the replication slot", svc)
			require.NotContains(t, buf.String(), "relay lost its replication stream", svc)
		}
	}
	stop()
	running.Wait()
}

// Random passwords in the example's URLs (and keyword/value strings) never
// appear in what it prints, whichever way a connection fails, nor in the
// log lines of a client whose database cannot be reached (captured with a
// slog handler: the clients log each failed attempt while they wait).
func TestPasswordsNeverInTheExamplesOutput(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	u, err := url.Parse(dbtest.URL())
	require.NoError(t, err)
	amqpHost := strings.TrimSuffix(strings.SplitN(amqptest.URL(t), "@", 2)[1], "/")
	r := secrettest.Rand(t)
	for range 5 {
		pw := secrettest.Password(r, secrettest.Runes)
		dsn := fmt.Sprintf("host=%s port=%s user=postgres password=%s dbname=%s", u.Hostname(), u.Port(), secrettest.Quote(pw), strings.TrimPrefix(u.Path, "/"))
		for _, c := range []struct{ name, flag, url, want string }{
			{"unreachable", "-database-url", secrettest.URL("postgres", "postgres", pw, "127.0.0.1:1", "/x", ""), "PostgreSQL is unreachable at 127.0.0.1:1"},
			{"unreachable, keyword/value", "-database-url", strings.Replace(dsn, "port="+u.Port(), "port=1", 1), "PostgreSQL is unreachable at 127.0.0.1:1"},
			{"wrong database", "-database-url", secrettest.URL("postgres", "postgres", pw, u.Host, "/no_such_db", ""), "no_such_db"},
			{"unparsable", "-database-url", strings.Replace(secrettest.URL("postgres", "postgres", pw, u.Host, "/x", ""), u.Host, "127.0.0.1:port", 1), "not a valid PostgreSQL URL"},
			{"bad setting, keyword/value", "-database-url", dsn + " connect_timeout=soon", "password=***"},
			{"audit URL unreachable", "-audit-database-url", secrettest.URL("postgres", "postgres", pw, "127.0.0.1:1", "/x", ""), "PostgreSQL is unreachable at 127.0.0.1:1"},
			{"broker refuses the password", "-amqp-url", secrettest.URL("amqp", "guest", pw, amqpHost, "/", ""), "check the user name, password and vhost"},
			{"broker unreachable", "-amqp-url", secrettest.URL("amqp", "guest", pw, "127.0.0.1:1", "/", ""), "is RabbitMQ running?"},
			{"broker URL unparsable", "-amqp-url", strings.Replace(secrettest.URL("amqp", "guest", pw, amqpHost, "/", ""), amqpHost, "127.0.0.1:port", 1), "not a valid URL"},
		} {
			var out, errOut bytes.Buffer
			code := run(ctx, []string{"-orders", "1", c.flag, c.url}, &out, &errOut)
			require.NotEqual(t, 0, code, c.name)
			require.Contains(t, errOut.String(), c.want, c.name)
			secrettest.NoLeak(t, out.String()+errOut.String(), pw, c.name)
		}
	}

	// A client waiting for a database it cannot reach logs each attempt.
	pw := secrettest.Password(r, secrettest.Runes)
	for _, dbURL := range []string{
		secrettest.URL("postgres", "app", pw, "127.0.0.1:1", "/shop", ""),
		"host=127.0.0.1 port=1 user=app dbname=shop password=" + secrettest.Quote(pw),
	} {
		pool, err := pgxpool.New(ctx, dbURL)
		require.NoError(t, err)
		var logs testkit.Buffer
		b := amqptest.NewBroker(t, rabbitmq.Config{})
		c, err := participant.NewClient(participant.Config{Pool: pool, Broker: b, Schema: "shop_inventory", Service: "inventory",
			Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
		require.NoError(t, err)
		inventory.New("shop_inventory").Register(c)
		stop := testkit.Run(t, c.Run)
		testkit.WaitFor(t, time.Minute, "the client to log two failed attempts", func() bool {
			return strings.Count(logs.String(), "not reachable yet") >= 2
		})
		require.NoError(t, stop())
		pool.Close()
		require.Contains(t, logs.String(), "user=app database=shop")
		secrettest.NoLeak(t, logs.String(), pw, "the client's log")
	}
}
