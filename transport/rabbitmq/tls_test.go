package rabbitmq_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/internal/testkit/servers"
	"github.com/sagabox/sagabox/transport"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

// tlsURL returns the node's amqps URL with params as its query.
func tlsURL(node *servers.RabbitMQ, params map[string]string) string {
	u, _ := url.Parse(node.TLSURL())
	q := url.Values{}
	for k, v := range params {
		q.Set(k, v)
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// startTLSNode starts a private node with a TLS listener of certs and
// stops it when the test ends.
func startTLSNode(t *testing.T, certs *servers.Certs, requireClientCert bool) *servers.RabbitMQ {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	node, err := servers.StartRabbitMQ(ctx, servers.RabbitMQOptions{TLS: &servers.RabbitMQTLS{Certs: certs, FailIfNoPeerCert: requireClientCert}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, node.Close()) })
	return node
}

// roundTrip connects a broker with cfg, and publishes and consumes ten
// commands through it.
func roundTrip(t *testing.T, cfg rabbitmq.Config) {
	t.Helper()
	ctx := testCtx(t)
	b, err := rabbitmq.New(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	require.NoError(t, b.Declare(ctx, spec))
	got := newIDSet()
	runSubscriber(t, b, spec, transport.HandlerFunc(func(_ context.Context, d *transport.Delivery) transport.Outcome {
		got.add(d.MessageID)
		return transport.Ack()
	}), nil)
	publishAndConsume(ctx, t, b, got, 10)
}

// A broker whose TLS listener requires client certificates: an amqps URL
// with the CA and a client certificate (or a Config.TLS with them) carries
// messages both ways, and DialAdmin connects the same way. Without a client
// certificate, with a CA that did not issue the broker's certificate, with
// a server name the certificate does not hold, or against the plain AMQP
// port, the connection is refused with an error that names the host, the
// CA and what to do, and never the password.
func TestTLSWithClientCertificates(t *testing.T) {
	t.Parallel()
	certs, err := servers.NewCerts(t.TempDir(), "sagabox broker CA", "client")
	require.NoError(t, err)
	other, err := servers.NewCerts(t.TempDir(), "some other CA", "client")
	require.NoError(t, err)
	node := startTLSNode(t, certs, true)
	mtls := map[string]string{"cacertfile": certs.CAFile, "certfile": certs.ClientCertFile, "keyfile": certs.ClientKeyFile}
	host := "127.0.0.1:" + itoa(node.TLSPort())

	t.Run("URL parameters", func(t *testing.T) {
		t.Parallel()
		cfg := amqptest.Config(t)
		cfg.URL = tlsURL(node, mtls)
		roundTrip(t, cfg)
	})
	t.Run("Config.TLS", func(t *testing.T) {
		t.Parallel()
		roots := x509.NewCertPool()
		ca, err := os.ReadFile(certs.CAFile)
		require.NoError(t, err)
		require.True(t, roots.AppendCertsFromPEM(ca))
		cert, err := tls.LoadX509KeyPair(certs.ClientCertFile, certs.ClientKeyFile)
		require.NoError(t, err)
		cfg := amqptest.Config(t)
		cfg.URL = node.TLSURL()
		cfg.TLS = &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		roundTrip(t, cfg)
		require.Empty(t, cfg.TLS.ServerName, "Config.TLS is not changed")
	})
	t.Run("admin", func(t *testing.T) {
		t.Parallel()
		adm, err := rabbitmq.DialAdmin(testCtx(t), rabbitmq.Config{URL: tlsURL(node, mtls), Namespace: amqptest.Namespace(t)})
		require.NoError(t, err)
		require.NoError(t, adm.Close())
	})

	refused := func(t *testing.T, rawURL string, want ...string) {
		t.Helper()
		cfg := amqptest.Config(t)
		cfg.URL = strings.Replace(rawURL, "guest:guest@", "guest:tls-s3cret-pw@", 1)
		_, err := rabbitmq.New(testCtx(t), cfg)
		require.Error(t, err)
		for _, w := range want {
			require.Contains(t, err.Error(), w)
		}
		require.NotContains(t, err.Error(), "tls-s3cret-pw")
		_, err = rabbitmq.DialAdmin(testCtx(t), rabbitmq.Config{URL: cfg.URL})
		require.Error(t, err)
		for _, w := range want {
			require.Contains(t, err.Error(), w)
		}
	}
	t.Run("wrong CA", func(t *testing.T) {
		t.Parallel()
		p := map[string]string{"cacertfile": other.CAFile, "certfile": certs.ClientCertFile, "keyfile": certs.ClientKeyFile}
		refused(t, tlsURL(node, p), "certificate of the broker at "+host, "issued by sagabox broker CA",
			"does not verify against the CA in cacertfile="+other.CAFile+" (some other CA)", "name the CA that issued it")
	})
	t.Run("no client certificate", func(t *testing.T) {
		t.Parallel()
		// The broker's refusal comes after the TLS 1.3 handshake, and the
		// client sees it in one of several ways (a reset, a frame it cannot
		// read, a connection closed): each is explained.
		for range 20 {
			refused(t, tlsURL(node, map[string]string{"cacertfile": certs.CAFile}), "the broker at "+host+" closed the connection after the TLS handshake",
				"requires a client certificate", "certfile and keyfile")
		}
	})
	t.Run("wrong server name", func(t *testing.T) {
		t.Parallel()
		p := map[string]string{"cacertfile": certs.CAFile, "certfile": certs.ClientCertFile, "keyfile": certs.ClientKeyFile, "server_name_indication": "rabbit.example"}
		refused(t, tlsURL(node, p), "certificate of the broker at "+host, "is for localhost, 127.0.0.1, not for \"rabbit.example\"")
	})
	t.Run("plain port", func(t *testing.T) {
		t.Parallel()
		u, err := url.Parse(tlsURL(node, mtls))
		require.NoError(t, err)
		u.Host = "127.0.0.1:" + itoa(node.Port())
		refused(t, u.String(), "127.0.0.1:"+itoa(node.Port())+" does not speak TLS", "plain AMQP port")
	})
}

// A TLS listener that verifies client certificates only when given one
// accepts an amqps client without a certificate, and one with.
func TestTLSWithoutClientCertificate(t *testing.T) {
	t.Parallel()
	certs, err := servers.NewCerts(t.TempDir(), "sagabox broker CA", "client")
	require.NoError(t, err)
	node := startTLSNode(t, certs, false)
	for name, params := range map[string]map[string]string{
		"CA only":            {"cacertfile": certs.CAFile},
		"client certificate": {"cacertfile": certs.CAFile, "certfile": certs.ClientCertFile, "keyfile": certs.ClientKeyFile},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg := amqptest.Config(t)
			cfg.URL = tlsURL(node, params)
			roundTrip(t, cfg)
		})
	}
}

// TLS settings that cannot be used, or that would let a connection go out
// in plain text, are refused before anything is dialled, each with the
// field or parameter at fault.
func TestTLSConfigErrors(t *testing.T) {
	t.Parallel()
	certs, err := servers.NewCerts(t.TempDir(), "sagabox broker CA", "client")
	require.NoError(t, err)
	notPEM := filepath.Join(t.TempDir(), "not.pem")
	require.NoError(t, os.WriteFile(notPEM, []byte("not a certificate\n"), 0o644))
	missing := filepath.Join(t.TempDir(), "missing.pem")
	cases := map[string]struct {
		cfg  rabbitmq.Config
		want string
	}{
		"TLS parameters on amqp": {
			rabbitmq.Config{URL: "amqp://guest:pw@127.0.0.1:5672/?cacertfile=" + certs.CAFile},
			"the TLS parameters cacertfile need an amqps:// URL: amqp:// is plain text",
		},
		"Config.TLS with amqp": {
			rabbitmq.Config{URL: "amqp://guest:pw@127.0.0.1:5672/", TLS: &tls.Config{MinVersion: tls.VersionTLS12}},
			"Config.TLS is set but the URL is amqp:// (plain text)",
		},
		"mixed schemes": {
			rabbitmq.Config{URL: "amqps://guest:pw@127.0.0.1:5671/", URLs: []string{"amqp://guest:pw@127.0.0.2:5672/"}},
			"mix amqp:// and amqps://",
		},
		"missing CA file": {
			rabbitmq.Config{URL: "amqps://guest:pw@127.0.0.1:5671/?cacertfile=" + missing},
			"cacertfile: open " + missing + ": no such file or directory",
		},
		"CA file without a certificate": {
			rabbitmq.Config{URL: "amqps://guest:pw@127.0.0.1:5671/?cacertfile=" + notPEM},
			"cacertfile " + notPEM + " holds no PEM certificate",
		},
		"certfile without keyfile": {
			rabbitmq.Config{URL: "amqps://guest:pw@127.0.0.1:5671/?certfile=" + certs.ClientCertFile},
			"needs both certfile and keyfile",
		},
		"missing key file": {
			rabbitmq.Config{URL: "amqps://guest:pw@127.0.0.1:5671/?certfile=" + certs.ClientCertFile + "&keyfile=" + missing},
			"client certificate certfile=" + certs.ClientCertFile + ", keyfile=" + missing,
		},
		"verify_none": {
			rabbitmq.Config{URL: "amqps://guest:pw@127.0.0.1:5671/?verify=verify_none"},
			"verify=verify_none: sagabox always verifies the broker's certificate",
		},
		"Config.TLS and parameters": {
			rabbitmq.Config{URL: "amqps://guest:pw@127.0.0.1:5671/?cacertfile=" + certs.CAFile, TLS: &tls.Config{MinVersion: tls.VersionTLS12}},
			"both Config.TLS and the URL's TLS parameter cacertfile are set",
		},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			err := c.cfg.WithDefaults().Validate()
			require.Error(t, err)
			require.Contains(t, err.Error(), c.want)
			require.Contains(t, err.Error(), "guest:***@", "the URL is named, without its password")
			require.NotContains(t, err.Error(), ":pw@")
			_, err = rabbitmq.New(testCtx(t), c.cfg)
			require.ErrorContains(t, err, c.want)
		})
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
