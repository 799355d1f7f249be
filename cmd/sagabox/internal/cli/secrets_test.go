package cli_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/cmd/sagabox/internal/cli"
	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/internal/testkit/secrettest"
	"github.com/sagabox/sagabox/internal/testkit/servers"
)

// Random passwords, in PostgreSQL URLs, in keyword/value strings and in
// AMQP URLs, never appear in what the commands print, as a table or as
// JSON, whichever way the connection fails: a wrong password (a private
// server that checks them), a wrong database with the right one, an
// unreachable server, a string that does not parse, a bad setting, a
// broker that refuses the password, TLS files on an amqp:// URL.
func TestPasswordsNeverPrinted(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pg, err := servers.StartPostgres(ctx, servers.PostgresOptions{Password: "Pw-admin-initial"})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, pg.Close()) })
	admin, err := pgxpool.New(ctx, pg.URL())
	require.NoError(t, err)
	defer admin.Close()
	host := "127.0.0.1:" + strconv.Itoa(pg.Port())
	amqpHost := strings.TrimSuffix(strings.SplitN(amqptest.URL(t), "@", 2)[1], "/")
	r := secrettest.Rand(t)

	commands := [][]string{{"saga", "list"}, {"--json", "migrate", "up"}, {"ui", "--addr", "127.0.0.1:0"}}
	brokerCommands := [][]string{{"dlq", "list", "--queue", "inventory"}, {"--json", "namespace", "teardown", "--queue", "inventory"}}
	for range 5 {
		right, wrong := secrettest.Password(r, secrettest.Runes), secrettest.Password(r, secrettest.Runes)
		_, err := admin.Exec(ctx, "DROP ROLE IF EXISTS app; CREATE ROLE app LOGIN PASSWORD '"+strings.ReplaceAll(right, "'", "''")+"'")
		require.NoError(t, err)
		dsn := func(pw, extra string) string {
			return fmt.Sprintf("host=127.0.0.1 port=%d user=app password=%s dbname=postgres sslmode=disable %s", pg.Port(), secrettest.Quote(pw), extra)
		}
		cases := []struct {
			name, url, secret, want string
			code                    int
		}{
			{"wrong password", secrettest.URL("postgres", "app", wrong, host, "/postgres", "sslmode=disable"), wrong, "authentication failed for user app", cli.ExitError},
			{"wrong password, keyword/value", dsn(wrong, ""), wrong, "authentication failed for user app", cli.ExitError},
			{"wrong database", secrettest.URL("postgres", "app", right, host, "/no_such_db", "sslmode=disable"), right, "database no_such_db does not exist", cli.ExitError},
			{"wrong database, keyword/value", strings.Replace(dsn(right, ""), "dbname=postgres", "dbname=no_such_db", 1), right, "database no_such_db does not exist", cli.ExitError},
			{"unreachable", secrettest.URL("postgres", "app", right, "127.0.0.1:1", "/postgres", ""), right, "cannot reach PostgreSQL at 127.0.0.1:1", cli.ExitError},
			{"unreachable, keyword/value", strings.Replace(dsn(right, ""), "port="+strconv.Itoa(pg.Port()), "port=1", 1), right, "cannot reach PostgreSQL at 127.0.0.1:1", cli.ExitError},
			{"unparsable", strings.Replace(secrettest.URL("postgres", "app", right, host, "/postgres", ""), host, "127.0.0.1:port", 1), right, "not a valid PostgreSQL URL", cli.ExitUsage},
			{"bad setting, keyword/value", dsn(right, "connect_timeout=soon"), right, "password=***", cli.ExitUsage},
			{"missing CA file", secrettest.URL("postgres", "app", right, host, "/postgres", "sslmode=verify-full&sslrootcert=/no/ca.pem"), right, "/no/ca.pem", cli.ExitUsage},
		}
		for _, c := range cases {
			for _, args := range commands {
				res := runBroker(t, append([]string{"--database-url", c.url}, args...)...)
				require.Equal(t, c.code, res.code, "%s, %v: %s", c.name, args, res.stderr)
				require.Contains(t, res.stderr, c.want, "%s, %v", c.name, args)
				secrettest.NoLeak(t, res.stdout+res.stderr, c.secret, fmt.Sprintf("%s, %v", c.name, args))
			}
		}
		for _, c := range []struct{ name, url, want string }{
			{"broker refuses the password", secrettest.URL("amqp", "guest", wrong, amqpHost, "/", ""), "check the user name, password and vhost"},
			{"broker unreachable", secrettest.URL("amqp", "guest", wrong, "127.0.0.1:1", "/", ""), "is RabbitMQ running?"},
			{"broker URL unparsable", strings.Replace(secrettest.URL("amqp", "guest", wrong, amqpHost, "/", ""), amqpHost, "127.0.0.1:port", 1), "not a valid URL"},
			{"TLS files on amqp://", secrettest.URL("amqp", "guest", wrong, amqpHost, "/", "cacertfile=/no/ca.pem"), "need an amqps:// URL"},
		} {
			for _, args := range brokerCommands {
				res := runBroker(t, append(args, "--amqp-url", c.url, "--namespace", amqptest.Namespace(t))...)
				require.Equal(t, cli.ExitError, res.code, "%s, %v: %s", c.name, args, res.stderr)
				require.Contains(t, res.stderr, c.want, "%s, %v", c.name, args)
				secrettest.NoLeak(t, res.stdout+res.stderr, wrong, fmt.Sprintf("%s, %v", c.name, args))
			}
		}
	}
}
