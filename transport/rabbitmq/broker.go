// Package rabbitmq is the RabbitMQ adapter of package transport, built on
// github.com/rabbitmq/amqp091-go.
//
// A Broker owns two AMQP connections, as RabbitMQ advises: one that publishes
// ("<ConnectionName>.publish") and one that consumes
// ("<ConnectionName>.consume"). During a memory or disk alarm RabbitMQ blocks
// the connections that publish, and a blocked connection stops reading
// everything, acknowledgements included; with its own connection a consumer
// keeps draining its queues, which is what clears the alarm. The consuming
// connection never publishes: the dead-letter and delayed-retry copies that
// Subscribe publishes go through the publishing connection, so while it is
// blocked they fail fast and the delivery returns to its queue instead of
// stalling the consumer (see Subscribe).
//
// The broker declares a namespaced topology (durable exchanges, quorum or
// classic queues, a dead-letter queue per service queue), publishes batches
// with pipelined publisher confirms and mandatory routing, consumes with
// prefetch and manual acknowledgement, and reconnects each connection on its
// own with exponential backoff: publishing resumes after the publishing
// connection comes back, and every running Subscribe re-subscribes after the
// consuming connection comes back.
//
// Names: with Namespace "shop", the exchanges are "shop.commands" (direct),
// "shop.replies" (direct), "shop.events" (topic) and "shop.dead-letter"
// (direct); the queue of QueueSpec{Name: "inventory"} is "shop.inventory" and
// its dead-letter queue "shop.inventory.dead-letter".
//
// A delayed transport.Retry holds nothing while it waits: the adapter parks
// a confirmed copy of the message in one of the queue's retry queues,
// "shop.inventory.retry.1s", ".retry.5s", ".retry.30s" and ".retry.2m"
// (the shortest not below the delay asked for), acknowledges the original,
// and the copy expires back into "shop.inventory". See RetryDelays.
//
// TLS: an amqps:// URL connects over TLS and verifies the broker's
// certificate, with the CA and client certificate named by the URL's query
// parameters (cacertfile, certfile, keyfile) or by Config.TLS; nothing
// falls back to plain text (see Config.URL). Passwords never appear in the
// broker's errors or logs (RedactURL).
package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/metric"

	"github.com/sagabox/sagabox/transport"
)

// Errors returned by a Broker. Test for them with errors.Is.
var (
	// ErrClosed is returned by calls on a closed Broker.
	ErrClosed = errors.New("rabbitmq: broker closed")
	// ErrNotConnected is returned by Publish while the publishing
	// connection is down and being re-established. Retry later.
	ErrNotConnected = errors.New("rabbitmq: not connected to the broker (reconnecting)")
	// ErrBlocked is returned by Publish while the broker blocks the
	// publishing connection (a memory or disk alarm). Retry later.
	ErrBlocked = errors.New("rabbitmq: connection blocked by the broker")
	// ErrUnroutable is the per-message error of a message that no queue is
	// bound to receive.
	ErrUnroutable = fmt.Errorf("rabbitmq: %w", transport.ErrUnroutable)
	// ErrNacked is the per-message error of a message the broker refused.
	ErrNacked = errors.New("rabbitmq: message nacked by the broker")
)

var (
	_ transport.Broker       = (*Broker)(nil)
	_ transport.Availability = (*Broker)(nil)
)

// Broker is a transport.Broker over two RabbitMQ connections, one for
// publishing and one for consuming. It is safe for concurrent use.
type Broker struct {
	cfg Config
	eps []endpoint // the URLs with their TLS settings, in Config order
	log *slog.Logger
	// adapterDeadLetters counts deliveries the adapter dead-letters on its
	// own: they could not be decoded, or reached DeliveryLimit; the
	// library's other dead letters are counted by the handler that decided
	// them.
	adapterDeadLetters metric.Int64Counter

	done      chan struct{} // closed by Close
	closeOnce sync.Once
	wg        sync.WaitGroup // the two connection managers

	// pub carries Publish and the copies Subscribe publishes; con carries
	// Subscribe (consuming, acknowledging) and Declare. Only pub ever
	// publishes, so only pub can be blocked by a broker alarm.
	pub, con link

	mu     sync.Mutex
	specs  map[string]transport.QueueSpec
	queues []string // logical queue names, in declaration order

	// blockedHook, when set (tests), replaces the publishing connection's
	// NotifyBlocked channel.
	blockedHook chan amqp.Blocking
}

// Connection roles, the suffixes of the connection names.
const (
	rolePublish = "publish"
	roleConsume = "consume"
)

// link is one of the broker's connections: its role and its live session.
type link struct {
	role string

	mu     sync.Mutex
	sess   *session      // nil while disconnected
	ready  chan struct{} // closed when sess becomes non-nil
	lostAt time.Time     // when sess became nil; zero while connected
	node   int           // index in Config.urls of the node dialled first
}

// down returns since when l has been disconnected, or the zero time.
func (l *link) down() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lostAt
}

// Unavailable implements transport.Availability: since when either of the
// broker's connections (consuming, publishing) has been lost, or the zero
// time while both are up.
func (b *Broker) Unavailable() time.Time {
	c, p := b.con.down(), b.pub.down()
	switch {
	case c.IsZero():
		return p
	case p.IsZero() || c.Before(p):
		return c
	}
	return p
}

// current returns the live session, or nil while disconnected.
func (l *link) current() *session {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sess
}

// session is one live connection and the goroutines serving it.
type session struct {
	conn   *amqp.Connection
	lost   chan struct{}    // closed once the connection is gone
	pubReq chan *pubRequest // served on the publishing connection only
	wg     sync.WaitGroup

	mu            sync.Mutex
	blockedReason string
	blocked       chan struct{} // closed while blocked; nil when not
}

func (s *session) blockState() (string, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.blockedReason, s.blocked
}

// New opens the publishing and the consuming connection to RabbitMQ and
// declares the exchanges of cfg.Namespace. A failure to connect is returned
// at once (New does not retry); after New succeeds the broker reconnects on
// its own.
func New(ctx context.Context, cfg Config) (*Broker, error) {
	return newBroker(ctx, cfg, nil)
}

func newBroker(ctx context.Context, cfg Config, blockedHook chan amqp.Blocking) (*Broker, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	// The name, unit and attribute keys are those of internal/telemetry's
	// dead-letter counter, so both land in one metric.
	adapterDeadLetters, err := cfg.MeterProvider.Meter("github.com/sagabox/sagabox").Int64Counter("sagabox.dead_letters",
		metric.WithUnit("{message}"), metric.WithDescription("Messages moved to a dead-letter queue, by reason class."))
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: create metrics: %w", err)
	}
	eps, err := cfg.endpoints()
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: invalid config: %w", err)
	}
	b := &Broker{
		adapterDeadLetters: adapterDeadLetters,
		cfg:                cfg,
		eps:                eps,
		log:                cfg.Logger.With("component", "rabbitmq"),
		done:               make(chan struct{}),
		pub:                link{role: rolePublish, ready: make(chan struct{})},
		con:                link{role: roleConsume, ready: make(chan struct{})},
		specs:              make(map[string]transport.QueueSpec),

		blockedHook: blockedHook,
	}
	pubSess, err := b.connect(ctx, &b.pub)
	if err != nil {
		return nil, err
	}
	conSess, err := b.connect(ctx, &b.con)
	if err != nil {
		_ = pubSess.conn.Close()
		return nil, err
	}
	b.wg.Add(2)
	go b.run(&b.pub, pubSess)
	go b.run(&b.con, conSess)
	return b, nil
}

// Close closes both connections and stops reconnecting. Publish and Declare
// calls in flight fail; running Subscribe calls return ErrClosed after their
// handlers finish. Close is idempotent.
func (b *Broker) Close() error {
	b.closeOnce.Do(func() { close(b.done) })
	b.wg.Wait()
	return nil
}

func (b *Broker) closed() bool {
	select {
	case <-b.done:
		return true
	default:
		return false
	}
}

// connect dials the connection of l and declares the topology on it. Both
// connections declare it, so that each finds its exchanges and queues after
// a broker restart whichever comes back first.
func (b *Broker) connect(ctx context.Context, l *link) (*session, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(b.cfg.ConnectionName + "." + l.role)
	props["product"] = "sagabox"
	for k, v := range b.cfg.ClientProperties {
		props[k] = v
	}
	timeout := b.cfg.DialTimeout
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < timeout {
		timeout = max(time.Until(dl), time.Millisecond)
	}
	conn, err := b.dial(l, amqp.Config{
		Properties: props,
		Heartbeat:  10 * time.Second,
		Locale:     "en_US",
		Dial:       amqp.DefaultDial(timeout),
	})
	if err != nil {
		return nil, err
	}
	if err := b.declareAll(ctx, conn); err != nil {
		_ = conn.Close()
		return nil, err
	}
	sess := &session{
		conn:   conn,
		lost:   make(chan struct{}),
		pubReq: make(chan *pubRequest),
	}
	return sess, nil
}

// dial connects l to the first node that accepts it, starting with the one
// it reached last and going through Config.URLs in turn. It returns the
// error of every node tried when none accepts.
func (b *Broker) dial(l *link, cfg amqp.Config) (*amqp.Connection, error) {
	l.mu.Lock()
	first := l.node
	l.mu.Unlock()
	var errs []error
	for i := range b.eps {
		n := (first + i) % len(b.eps)
		ep := &b.eps[n]
		dc, verified := ep.dialConfig(cfg)
		conn, err := amqp.DialConfig(ep.url, dc)
		if err == nil {
			l.mu.Lock()
			l.node = n
			l.mu.Unlock()
			return conn, nil
		}
		errs = append(errs, dialError(ep, err, verified.Load()))
	}
	if len(errs) == 1 {
		return nil, errs[0]
	}
	return nil, errors.Join(errs...)
}

// run is the manager of l's connection: it serves a session until its
// connection is lost, then reconnects with backoff, until Close.
func (b *Broker) run(l *link, sess *session) {
	defer b.wg.Done()
	for {
		if b.serve(l, sess) {
			return
		}
		sess = b.reconnect(l)
		if sess == nil {
			return
		}
	}
}

// serve makes sess the live session of l, starts its workers (publishers
// and the blocked-state watcher on the publishing connection) and waits until
// its connection is lost (false) or the broker is closed (true).
func (b *Broker) serve(l *link, sess *session) (closed bool) {
	closeCh := sess.conn.NotifyClose(make(chan *amqp.Error, 1))
	if l.role == rolePublish {
		blockCh := b.blockedHook
		if blockCh == nil {
			blockCh = sess.conn.NotifyBlocked(make(chan amqp.Blocking, 1))
		}
		for range b.cfg.PublishChannels {
			sess.wg.Add(1)
			go b.publisher(sess)
		}
		sess.wg.Add(1)
		go b.watchBlocked(sess, blockCh)
	}

	l.mu.Lock()
	l.sess = sess
	l.lostAt = time.Time{}
	close(l.ready)
	l.mu.Unlock()

	var cause *amqp.Error
	select {
	case cause = <-closeCh:
	case <-b.done:
		closed = true
	}

	l.mu.Lock()
	l.sess = nil
	l.lostAt = time.Now()
	l.ready = make(chan struct{})
	l.mu.Unlock()
	close(sess.lost)
	if closed {
		_ = sess.conn.Close()
	} else {
		b.log.Warn("rabbitmq connection lost; reconnecting", "connection", l.role, "err", b.redact(causeErr(cause)))
		_ = sess.conn.Close()
	}
	sess.wg.Wait()
	return closed
}

func causeErr(e *amqp.Error) error {
	if e == nil {
		return errors.New("connection closed")
	}
	return e
}

// watchBlocked tracks connection.blocked/unblocked notifications of the
// publishing connection so that Publish fails fast while the broker has an
// alarm.
func (b *Broker) watchBlocked(sess *session, ch <-chan amqp.Blocking) {
	defer sess.wg.Done()
	for {
		select {
		case bl, ok := <-ch:
			if !ok {
				return
			}
			sess.mu.Lock()
			switch {
			case bl.Active && sess.blocked == nil:
				sess.blockedReason = bl.Reason
				sess.blocked = make(chan struct{})
				close(sess.blocked)
				b.log.Warn("rabbitmq connection blocked by the broker; publishing fails until it is unblocked", "connection", rolePublish, "reason", bl.Reason)
			case !bl.Active && sess.blocked != nil:
				sess.blockedReason = ""
				sess.blocked = nil
				b.log.Info("rabbitmq connection unblocked", "connection", rolePublish)
			}
			sess.mu.Unlock()
		case <-sess.lost:
			return
		}
	}
}

// reconnect dials l's connection with exponential backoff and jitter until
// it succeeds (returning the new session) or the broker is closed (nil).
func (b *Broker) reconnect(l *link) *session {
	start := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-b.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	for attempt := 1; ; attempt++ {
		if !sleepCtx(ctx, backoff(b.cfg.ReconnectMin, b.cfg.ReconnectMax, attempt)) {
			return nil
		}
		sess, err := b.connect(ctx, l)
		if err == nil {
			b.log.Info("rabbitmq connection restored", "connection", l.role, "attempts", attempt, "downtime", time.Since(start).Round(time.Millisecond))
			return sess
		}
		if ctx.Err() != nil {
			return nil
		}
		lvl := slog.LevelDebug
		if attempt%10 == 1 {
			lvl = slog.LevelWarn
		}
		b.log.Log(ctx, lvl, "rabbitmq reconnect failed", "connection", l.role, "attempt", attempt, "err", err)
	}
}

// backoff returns the delay before the given attempt (1-based): min·2^(n-1)
// capped at max, with full jitter over its upper half.
func backoff(lo, hi time.Duration, attempt int) time.Duration {
	d := lo
	for i := 1; i < attempt && d < hi; i++ {
		d *= 2
	}
	d = min(d, hi)
	if d <= 0 {
		return 0
	}
	half := d / 2
	return half + rand.N(d-half+1)
}

// sleepCtx waits d or until ctx is done; it reports whether d elapsed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// awaitSession waits until a session of l is live, ctx is done or the
// broker is closed.
func (b *Broker) awaitSession(ctx context.Context, l *link) (*session, error) {
	for {
		l.mu.Lock()
		sess, ready := l.sess, l.ready
		l.mu.Unlock()
		if sess != nil {
			return sess, nil
		}
		select {
		case <-ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-b.done:
			return nil, ErrClosed
		}
	}
}

// dialError explains a failed dial of ep without the password and says
// what to do. verified says whether a TLS handshake verified the broker's
// certificate before the dial failed.
func dialError(ep *endpoint, err error, verified bool) error {
	rawURL := ep.url
	hint := ep.tlsHint(err, verified)
	var aerr *amqp.Error
	switch {
	case hint != "":
	case errors.Is(err, syscall.ECONNREFUSED):
		hint = `; is RabbitMQ running? start it with "rabbitmq-server -detached"`
	case errors.As(err, &aerr) && aerr.Code == amqp.AccessRefused:
		hint = "; check the user name, password and vhost in the URL"
	case errors.Is(err, amqp.ErrCredentials):
		hint = "; check the user name and password in the URL"
	case errors.Is(err, amqp.ErrVhost):
		hint = "; check the vhost in the URL"
	}
	return &redactedError{
		msg: fmt.Sprintf("rabbitmq: cannot connect to %s: %s%s", redactURL(rawURL), scrub(rawURL, err.Error()), hint),
		err: err,
	}
}

// redactedError carries an error whose text had the URL password removed.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// redact removes the passwords of every configured URL from err.
func (b *Broker) redact(err error) error {
	for _, u := range b.cfg.urls() {
		err = redactErr(u, err)
	}
	return err
}

func redactErr(rawURL string, err error) error {
	if err == nil {
		return nil
	}
	msg := scrub(rawURL, err.Error())
	if msg == err.Error() {
		return err
	}
	return &redactedError{msg: msg, err: err}
}

// redactURL returns rawURL with its password replaced by "***". A URL that
// cannot be parsed, or whose '@' the parser did not take for the end of the
// user information (a password with an unescaped '/', '?' or '#'), keeps
// only what follows its last '@': a password cannot be told apart there.
func redactURL(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil || (strings.Contains(rawURL, "@") && (u.User == nil || strings.Contains(u.Host+u.Path+u.RawQuery+u.Fragment, "@"))) {
		if i := strings.LastIndex(rawURL, "@"); i >= 0 {
			if j := strings.Index(rawURL, "://"); j >= 0 && j < i {
				return rawURL[:j+3] + "***" + rawURL[i:]
			}
			return "***" + rawURL[i:]
		}
		if err != nil {
			return "(a URL that cannot be parsed)"
		}
		return rawURL
	}
	if u.User == nil {
		return u.String()
	}
	if _, has := u.User.Password(); !has {
		return u.String()
	}
	s := u.Scheme + "://" + u.User.Username() + ":***@" + u.Host + u.EscapedPath()
	if u.RawQuery != "" {
		s += "?" + u.RawQuery
	}
	return s
}

// scrub removes the password of rawURL from msg.
func scrub(rawURL, msg string) string {
	u, err := url.Parse(rawURL)
	if err != nil || u.User == nil {
		return msg
	}
	if pw, ok := u.User.Password(); ok && pw != "" {
		msg = strings.ReplaceAll(msg, rawURL, redactURL(rawURL))
		msg = strings.ReplaceAll(msg, ":"+pw+"@", ":***@")
	}
	return msg
}
