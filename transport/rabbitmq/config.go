package rabbitmq

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
)

// QueueType is the RabbitMQ queue type used for every queue the broker
// declares.
type QueueType string

// The supported queue types.
const (
	// QueueTypeQuorum declares replicated, durable quorum queues. It is the
	// right choice for production.
	QueueTypeQuorum QueueType = "quorum"
	// QueueTypeClassic declares durable classic queues.
	QueueTypeClassic QueueType = "classic"
)

// Defaults used by Config.WithDefaults.
const (
	DefaultURL             = "amqp://guest:guest@127.0.0.1:5672/"
	DefaultNamespace       = "sagabox"
	DefaultQueueType       = QueueTypeQuorum
	DefaultConfirmTimeout  = 15 * time.Second
	DefaultReconnectMin    = 100 * time.Millisecond
	DefaultReconnectMax    = 10 * time.Second
	DefaultDialTimeout     = 10 * time.Second
	DefaultPublishChannels = 8
	DefaultConnectionName  = "sagabox"
)

// Config configures a Broker. The zero value is usable: every field has a
// default.
type Config struct {
	// URL is the AMQP URL of the broker, with credentials and vhost. It never
	// appears in errors or logs with its password. Defaults to DefaultURL
	// (amqp://guest:guest@127.0.0.1:5672/).
	//
	// An amqps:// URL connects over TLS and verifies the broker's
	// certificate against the CA named by the URL's query parameter
	// cacertfile (a PEM file; the system's trusted CAs without it), with
	// the client certificate of certfile and keyfile (PEM files, both or
	// neither) when the broker asks for one; server_name_indication
	// overrides the host name the certificate must hold. These are
	// RabbitMQ's URI query parameters, e.g.
	// amqps://app:secret@rabbit.internal:5671/prod?cacertfile=/etc/sagabox/ca.pem&certfile=/etc/sagabox/app.pem&keyfile=/etc/sagabox/app.key.
	// The files are read once, by New and DialAdmin. An amqp:// URL is
	// plain text: TLS parameters with it are an error, never ignored.
	URL string

	// URLs are further AMQP URLs of other nodes of the same RabbitMQ cluster,
	// tried in order after URL. Each connection dials the node it last
	// reached first and, when that fails, the next URL in the list (wrapping
	// round), so a client reconnects to a surviving node when the one it
	// used is down. Their passwords never appear in errors or logs either.
	// They take TLS query parameters as URL does, and use TLS if URL does:
	// a list that mixes amqp:// and amqps:// is an error. Defaults to none.
	URLs []string

	// TLS, when set, is the TLS configuration of every amqps:// URL, for
	// programs that build their own: the CAs that verify the broker
	// (RootCAs; nil means the system's), a client certificate
	// (Certificates), and the server name (ServerName; defaults to each
	// URL's host). It takes the place of the URLs' TLS query parameters,
	// which must then be absent, and an amqp:// URL with it is an error.
	// It is cloned, never changed. Defaults to nil: the URLs' parameters.
	TLS *tls.Config

	// Namespace prefixes every exchange and queue the broker declares, so that
	// several systems (or tests) share one vhost without seeing each other's
	// messages: exchanges "<ns>.commands" (direct), "<ns>.replies" (direct),
	// "<ns>.events" (topic) and "<ns>.dead-letter" (direct); a service queue
	// "<ns>.<name>", its dead-letter queue "<ns>.<name>.dead-letter" and its
	// retry queues "<ns>.<name>.retry.<delay>" (see RetryDelays). It may
	// contain letters, digits, '.', '_' and '-'. Defaults to DefaultNamespace
	// ("sagabox").
	Namespace string

	// QueueType is the type of every queue declared, retry queues included
	// (quorum retry queues need RabbitMQ 3.10 or later). Changing it for an
	// existing queue fails the declaration: RabbitMQ cannot convert a queue.
	// Defaults to DefaultQueueType (quorum).
	QueueType QueueType

	// DeliveryLimit, when positive, sets x-delivery-limit on quorum queues:
	// the broker dead-letters a message (into the queue's dead-letter queue)
	// after that many failed deliveries. A delayed Retry puts a new copy of
	// the message in the queue, which the broker counts afresh, so the
	// adapter applies the limit to those itself: a message already retried
	// DeliveryLimit times with a delay is dead-lettered instead. It is a
	// safety net under the handler's own retry policy. Ignored for classic
	// queues. Defaults to 0, no limit.
	DeliveryLimit int

	// ConfirmTimeout bounds how long Publish waits for the broker to confirm
	// a batch. Messages not confirmed by then are reported as failed.
	// Defaults to DefaultConfirmTimeout (15s).
	ConfirmTimeout time.Duration

	// ReconnectMin is the first delay before reconnecting after the
	// connection is lost; the delay doubles (with jitter) on every failed
	// attempt up to ReconnectMax. Defaults to DefaultReconnectMin (100ms).
	ReconnectMin time.Duration

	// ReconnectMax caps the delay between reconnection attempts. Defaults to
	// DefaultReconnectMax (10s).
	ReconnectMax time.Duration

	// DialTimeout bounds the TCP connect and AMQP handshake. Defaults to
	// DefaultDialTimeout (10s).
	DialTimeout time.Duration

	// PublishChannels is how many confirm-mode channels publish concurrently.
	// Each channel publishes one batch at a time, pipelined, and waits for
	// its confirms; the clients of a process that share the broker (an
	// orchestrator and participants, each with its relay workers) publish
	// through these. Defaults to DefaultPublishChannels (8).
	PublishChannels int

	// ConnectionName names the broker's connections as RabbitMQ shows them
	// (connection_name client property) in its management UI and rabbitmqctl:
	// "<ConnectionName>.publish" and "<ConnectionName>.consume". Defaults to
	// DefaultConnectionName ("sagabox").
	ConnectionName string

	// ClientProperties are extra client properties advertised to the broker.
	// Defaults to none.
	ClientProperties map[string]any

	// Logger receives connection events and dead letters, with the
	// attribute component=rabbitmq. Defaults to slog.Default().
	Logger *slog.Logger

	// MeterProvider creates the counter of messages the broker dead-letters
	// itself (sagabox.dead_letters with sagabox.component=rabbitmq and
	// sagabox.dead_letter.reason=malformed when they cannot be decoded,
	// delivery_limit when they reached DeliveryLimit). Defaults to the
	// global provider.
	MeterProvider metric.MeterProvider
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.URL == "" {
		c.URL = DefaultURL
	}
	if c.Namespace == "" {
		c.Namespace = DefaultNamespace
	}
	if c.QueueType == "" {
		c.QueueType = DefaultQueueType
	}
	if c.ConfirmTimeout == 0 {
		c.ConfirmTimeout = DefaultConfirmTimeout
	}
	if c.ReconnectMin == 0 {
		c.ReconnectMin = DefaultReconnectMin
	}
	if c.ReconnectMax == 0 {
		c.ReconnectMax = max(DefaultReconnectMax, c.ReconnectMin)
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.PublishChannels == 0 {
		c.PublishChannels = DefaultPublishChannels
	}
	if c.ConnectionName == "" {
		c.ConnectionName = DefaultConnectionName
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.MeterProvider == nil {
		c.MeterProvider = otel.GetMeterProvider()
	}
	return c
}

// urls returns URL followed by URLs, without repeats: the nodes tried in
// turn.
func (c *Config) urls() []string {
	out := []string{c.URL}
	for _, u := range c.URLs {
		if u != "" && !slices.Contains(out, u) {
			out = append(out, u)
		}
	}
	return out
}

var namespaceRE = regexp.MustCompile(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`)

// validate checks a config that went through WithDefaults.
func (c *Config) validate() error {
	var errs []error
	if _, err := c.endpoints(); err != nil {
		errs = append(errs, err)
	}
	if !namespaceRE.MatchString(c.Namespace) {
		errs = append(errs, fmt.Errorf("Namespace %q: use letters, digits, '_', '-' and inner '.'", c.Namespace))
	}
	if c.QueueType != QueueTypeQuorum && c.QueueType != QueueTypeClassic {
		errs = append(errs, fmt.Errorf("QueueType %q: want %q or %q", c.QueueType, QueueTypeQuorum, QueueTypeClassic))
	}
	if c.DeliveryLimit < 0 {
		errs = append(errs, fmt.Errorf("DeliveryLimit %d is negative", c.DeliveryLimit))
	}
	if c.ConfirmTimeout < 0 {
		errs = append(errs, fmt.Errorf("ConfirmTimeout %s is negative", c.ConfirmTimeout))
	}
	if c.ReconnectMin < 0 {
		errs = append(errs, fmt.Errorf("ReconnectMin %s is negative", c.ReconnectMin))
	}
	if c.ReconnectMax < c.ReconnectMin {
		errs = append(errs, fmt.Errorf("ReconnectMax %s is less than ReconnectMin %s", c.ReconnectMax, c.ReconnectMin))
	}
	if c.DialTimeout < 0 {
		errs = append(errs, fmt.Errorf("DialTimeout %s is negative", c.DialTimeout))
	}
	if c.PublishChannels < 0 {
		errs = append(errs, fmt.Errorf("PublishChannels %d is negative", c.PublishChannels))
	}
	if len(errs) > 0 {
		return fmt.Errorf("rabbitmq: invalid config: %w", errors.Join(errs...))
	}
	return nil
}
