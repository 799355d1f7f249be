package rabbitmq

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TLS: an amqps URL is dialled over TLS and verifies the broker's
// certificate, with the CA and client certificate named by the URL's query
// parameters (RabbitMQ's URI query parameters, which amqp091-go and other
// RabbitMQ clients read too) or by Config.TLS. An amqp URL is plain text,
// and TLS settings with one are an error: nothing falls back to plain text.

// The TLS query parameters of an amqps URL.
const (
	paramCACertFile = "cacertfile"
	paramCertFile   = "certfile"
	paramKeyFile    = "keyfile"
	paramSNI        = "server_name_indication"
	paramVerify     = "verify"
)

var tlsParams = []string{paramCACertFile, paramCertFile, paramKeyFile, paramSNI, paramVerify}

// endpoint is one configured URL with its TLS settings resolved.
type endpoint struct {
	url  string
	host string // host:port, for messages
	// tls is the TLS configuration of an amqps URL; nil for amqp.
	tls *tls.Config
	// ca says which CAs verify the broker's certificate, for messages.
	ca string
	// clientCert says whether a client certificate is configured.
	clientCert bool
}

// endpoints resolves the TLS settings of every URL of c (URL, then URLs):
// it reads the CA and client certificate files an amqps URL names, and
// refuses TLS settings on an amqp URL and a list that mixes the two
// schemes.
func (c *Config) endpoints() ([]endpoint, error) {
	var eps []endpoint
	var errs []error
	for i, raw := range c.urls() {
		field := "URL"
		if i > 0 {
			field = fmt.Sprintf("URLs[%d]", i-1)
		}
		ep, err := c.endpoint(raw)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", field, redactURL(raw), err))
			continue
		}
		if i > 0 && len(eps) > 0 && (ep.tls == nil) != (eps[0].tls == nil) {
			errs = append(errs, fmt.Errorf("%s %s: URL and URLs mix amqp:// and amqps://, so a broker reached over TLS would be reached in plain text after a failover: use amqps:// for every node", field, redactURL(raw)))
			continue
		}
		eps = append(eps, ep)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return eps, nil
}

// endpoint resolves one URL.
func (c *Config) endpoint(raw string) (endpoint, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return endpoint{}, errors.New("not a valid URL")
	}
	q := u.Query()
	ep := endpoint{url: raw, host: u.Host}
	switch u.Scheme {
	case "amqp":
		var given []string
		for _, p := range tlsParams {
			if q.Has(p) {
				given = append(given, p)
			}
		}
		if len(given) > 0 {
			return endpoint{}, fmt.Errorf("the TLS parameters %s need an amqps:// URL: amqp:// is plain text", strings.Join(given, ", "))
		}
		if c.TLS != nil {
			return endpoint{}, errors.New("Config.TLS is set but the URL is amqp:// (plain text): use amqps://")
		}
		return ep, nil
	case "amqps":
	default:
		return endpoint{}, errors.New("scheme must be amqp or amqps")
	}
	if u.Port() == "" {
		ep.host = net.JoinHostPort(u.Hostname(), "5671")
	}
	if v := q.Get(paramVerify); q.Has(paramVerify) && v != "verify_peer" {
		return endpoint{}, fmt.Errorf("verify=%s: sagabox always verifies the broker's certificate (verify=verify_peer)", v)
	}
	if c.TLS != nil {
		for _, p := range tlsParams {
			if q.Has(p) {
				return endpoint{}, fmt.Errorf("both Config.TLS and the URL's TLS parameter %s are set: use one", p)
			}
		}
		ep.tls = c.TLS.Clone()
		ep.ca = "the CAs of Config.TLS.RootCAs"
		if ep.tls.RootCAs == nil {
			ep.ca = "the system's trusted CAs (Config.TLS.RootCAs is nil)"
		}
		ep.clientCert = len(ep.tls.Certificates) > 0 || ep.tls.GetClientCertificate != nil
	} else {
		ep.tls = &tls.Config{MinVersion: tls.VersionTLS12}
		ep.ca = "the system's trusted CAs (the URL names no cacertfile)"
		if file := q.Get(paramCACertFile); file != "" {
			pool, names, err := readCAFile(file)
			if err != nil {
				return endpoint{}, err
			}
			ep.tls.RootCAs = pool
			ep.ca = fmt.Sprintf("the CA in cacertfile=%s (%s)", file, strings.Join(names, ", "))
		}
		certFile, keyFile := q.Get(paramCertFile), q.Get(paramKeyFile)
		switch {
		case certFile != "" && keyFile != "":
			cert, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err != nil {
				return endpoint{}, fmt.Errorf("client certificate certfile=%s, keyfile=%s: %w", certFile, keyFile, err)
			}
			ep.tls.Certificates = []tls.Certificate{cert}
			ep.clientCert = true
		case certFile != "" || keyFile != "":
			return endpoint{}, errors.New("a client certificate needs both certfile and keyfile")
		}
		ep.tls.ServerName = q.Get(paramSNI)
	}
	if ep.tls.ServerName == "" {
		ep.tls.ServerName = u.Hostname()
	}
	return ep, nil
}

// readCAFile reads the PEM certificates of file into a pool and returns
// their subjects' common names.
func readCAFile(file string) (*x509.CertPool, []string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, nil, fmt.Errorf("cacertfile: %w", err)
	}
	pool := x509.NewCertPool()
	var names []string
	for rest := b; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, nil, fmt.Errorf("cacertfile %s: %w", file, err)
		}
		pool.AddCert(cert)
		names = append(names, subjectName(cert))
	}
	if len(names) == 0 {
		return nil, nil, fmt.Errorf("cacertfile %s holds no PEM certificate", file)
	}
	return pool, names, nil
}

func subjectName(c *x509.Certificate) string {
	if c.Subject.CommonName != "" {
		return c.Subject.CommonName
	}
	return c.Subject.String()
}

// dialConfig returns cfg set up to dial ep: over TLS with a fresh copy of
// its configuration for an amqps URL. The returned flag records whether a
// TLS handshake got as far as a verified broker certificate.
func (ep *endpoint) dialConfig(cfg amqp.Config) (amqp.Config, *atomic.Bool) {
	verified := new(atomic.Bool)
	if ep.tls == nil {
		return cfg, verified
	}
	tc := ep.tls.Clone()
	user := tc.VerifyConnection
	tc.VerifyConnection = func(cs tls.ConnectionState) error {
		if user != nil {
			if err := user(cs); err != nil {
				return err
			}
		}
		verified.Store(true)
		return nil
	}
	cfg.TLSClientConfig = tc
	return cfg, verified
}

// tlsHint explains err, a failed dial of the amqps endpoint ep, when TLS is
// the cause: the broker's certificate does not verify against ep's CA, is
// for another host or has expired; the port does not speak TLS; or the
// broker closed the connection after the handshake, as it does when it
// wants a client certificate it was not given. It returns "" otherwise.
func (ep *endpoint) tlsHint(err error, verified bool) string {
	if ep.tls == nil {
		return ""
	}
	var unknown x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	var invalid x509.CertificateInvalidError
	var record tls.RecordHeaderError
	switch {
	case errors.As(err, &unknown):
		issuer := ""
		if unknown.Cert != nil {
			issuer = fmt.Sprintf(" (issued by %s)", unknown.Cert.Issuer.CommonName)
		}
		return fmt.Sprintf("; TLS: the certificate of the broker at %s%s does not verify against %s: name the CA that issued it in the URL's cacertfile (or Config.TLS.RootCAs)",
			ep.host, issuer, ep.ca)
	case errors.As(err, &hostErr):
		names := "no host names"
		if hostErr.Certificate != nil {
			names = strings.Join(append(append([]string{}, hostErr.Certificate.DNSNames...), ipStrings(hostErr.Certificate.IPAddresses)...), ", ")
		}
		return fmt.Sprintf("; TLS: the certificate of the broker at %s (verified against %s) is for %s, not for %q: connect with a host name the certificate holds, or reissue it with that name",
			ep.host, ep.ca, names, hostErr.Host)
	case errors.As(err, &invalid):
		validity := ""
		if invalid.Cert != nil {
			validity = fmt.Sprintf(" (valid from %s to %s)", invalid.Cert.NotBefore.UTC().Format(time.RFC3339), invalid.Cert.NotAfter.UTC().Format(time.RFC3339))
		}
		return fmt.Sprintf("; TLS: the certificate of the broker at %s is not valid%s, checked against %s: renew it", ep.host, validity, ep.ca)
	case errors.As(err, &record):
		return fmt.Sprintf("; TLS: %s does not speak TLS: is it the plain AMQP port (5672 by default)? amqps:// needs the broker's TLS listener (5671 by default)", ep.host)
	case verified && closedByPeer(err):
		if ep.clientCert {
			return fmt.Sprintf("; TLS: the broker at %s closed the connection after the TLS handshake: it may not trust the client certificate (certfile) — it must be issued by a CA in the broker's ssl_options.cacertfile", ep.host)
		}
		return fmt.Sprintf("; TLS: the broker at %s closed the connection after the TLS handshake, as it does when it requires a client certificate (ssl_options.fail_if_no_peer_cert): give one with the URL's certfile and keyfile (or Config.TLS.Certificates)", ep.host)
	}
	return ""
}

// closedByPeer reports whether err, the failure of a dial whose TLS
// handshake went through, says the connection broke (reset, closed, a frame
// that could not be read) rather than that the broker answered the AMQP
// handshake with a refusal of its own (a wrong password or vhost).
func closedByPeer(err error) bool {
	var amqpErr *amqp.Error
	if errors.As(err, &amqpErr) {
		// A frame that could not be read, or the library's "connection is
		// not open" (ErrClosed): the peer closed the connection while the
		// AMQP handshake, before any channel, waited for it.
		return amqpErr.Code == amqp.FrameError || amqpErr.Code == amqp.ChannelError
	}
	var opErr *net.OpError
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) || errors.As(err, &opErr)
}

func ipStrings(ips []net.IP) []string {
	out := make([]string, len(ips))
	for i, ip := range ips {
		out[i] = ip.String()
	}
	return out
}
