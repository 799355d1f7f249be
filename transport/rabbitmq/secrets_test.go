package rabbitmq_test

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/internal/testkit/secrettest"
	"github.com/sagabox/sagabox/internal/testkit/servers"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

// Random passwords (every printable ASCII character, escaped in the URL as
// net/url escapes it) never appear in the errors of New and DialAdmin
// (wrong password, wrong vhost with the right one, an unreachable port, a
// URL that does not parse, TLS parameters on amqp://) nor in the broker's
// log lines when a connection is lost and its reconnects are refused. The
// node is private: the test changes guest's password.
func TestPasswordsNeverInErrorsOrLogs(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	node, err := servers.StartRabbitMQ(ctx, servers.RabbitMQOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, node.Close()) })
	host := "127.0.0.1:" + strconv.Itoa(node.Port())
	r := secrettest.Rand(t)

	for range 3 {
		pw := secrettest.Password(r, secrettest.ASCII)
		_, err := node.Ctl(ctx, "change_password", "guest", pw)
		require.NoError(t, err)
		wrong := secrettest.Password(r, secrettest.Runes)
		for name, c := range map[string]struct{ url, secret, want string }{
			"wrong password": {secrettest.URL("amqp", "guest", wrong, host, "/", ""), wrong, "check the user name, password and vhost"},
			"wrong vhost":    {secrettest.URL("amqp", "guest", pw, host, "/no-such-vhost", ""), pw, "vhost"},
			"unreachable":    {secrettest.URL("amqp", "guest", pw, "127.0.0.1:1", "/", ""), pw, "is RabbitMQ running?"},
			"unparsable":     {strings.Replace(secrettest.URL("amqp", "guest", pw, host, "/", ""), host, "127.0.0.1:port", 1), pw, "not a valid URL"},
			"TLS on amqp":    {secrettest.URL("amqp", "guest", pw, host, "/", "cacertfile=/etc/ca.pem"), pw, "need an amqps:// URL"},
		} {
			cfg := amqptest.Config(t)
			cfg.URL = c.url
			_, err := rabbitmq.New(ctx, cfg)
			require.Error(t, err, name)
			require.Contains(t, err.Error(), c.want, name)
			secrettest.NoLeak(t, err.Error(), c.secret, "New, "+name)
			_, err = rabbitmq.DialAdmin(ctx, rabbitmq.Config{URL: c.url})
			require.Error(t, err, name)
			secrettest.NoLeak(t, err.Error(), c.secret, "DialAdmin, "+name)
		}
		require.Contains(t, rabbitmq.RedactURL(secrettest.URL("amqps", "guest", pw, host, "/", "")), "guest:***@"+host)
	}

	// The connection is lost and the reconnects are refused: the password
	// in the URL is no longer guest's. The log lines of both never show it.
	pw := secrettest.Password(r, secrettest.ASCII)
	_, err = node.Ctl(ctx, "change_password", "guest", pw)
	require.NoError(t, err)
	var logs testkit.Buffer
	cfg := amqptest.Config(t)
	cfg.URL = secrettest.URL("amqp", "guest", pw, host, "/", "")
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	b, err := rabbitmq.New(ctx, cfg)
	require.NoError(t, err)
	defer func() { _ = b.Close() }()
	_, err = node.Ctl(ctx, "change_password", "guest", secrettest.Password(r, secrettest.ASCII))
	require.NoError(t, err)
	_, err = node.Ctl(ctx, "close_all_connections", "test: the password changed")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "rabbitmq reconnect failed") },
		time.Minute, 20*time.Millisecond, "the refused reconnect is logged:\n%s", logs.String())
	_, err = node.Ctl(ctx, "change_password", "guest", pw)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return strings.Count(logs.String(), "rabbitmq connection restored") == 2 },
		time.Minute, 20*time.Millisecond, "both connections come back:\n%s", logs.String())
	require.Contains(t, logs.String(), "guest:***@"+host, "the log names the URL, without its password")
	secrettest.NoLeak(t, logs.String(), pw, "the broker's log")
}

// A password written into a URL without escaping, which the URL parser
// then takes in part for the host, port or path, is hidden whole:
// everything before the last '@' goes.
func TestRedactURLUnescapedPassword(t *testing.T) {
	t.Parallel()
	for raw, secret := range map[string]string{
		"amqp://guest:12/ab@rabbit:5672/":  "12/ab",
		"amqp://guest:p?ss@rabbit:5672/":   "p?ss",
		"amqp://guest:p#ss@rabbit:5672/":   "p#ss",
		"amqps://guest:a@b/c@rabbit:5671/": "a@b/c",
		"amqp://guest:pw@rabbit:port/":     "pw",
	} {
		got := rabbitmq.RedactURL(raw)
		require.NotContains(t, got, secret, raw)
		require.Contains(t, got, "rabbit", "the host is still shown: %s", got)
	}
}
