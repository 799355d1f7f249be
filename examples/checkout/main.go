// Command checkout runs the sagabox checkout example: five services (orders,
// inventory, payment, shipping, loyalty), each with its own schema and
// queue. Orders creates an order and starts the checkout saga in one
// transaction; the saga reserves stock, charges the customer, waits for the
// payment provider to confirm the charge (a webhook the orders service
// receives), and awards loyalty points and creates a shipment; it
// compensates (revokes points, refunds, releases stock) when inventory,
// payment or shipping says no or the confirmation does not come in time.
//
// With no arguments it runs all five services in one process, places a mix
// of orders, shows progress, prints a summary and a saga timeline of each
// kind of outcome, and checks the business invariants:
//
//	go run ./examples/checkout
//
// Each service can also run as its own process (-service inventory, …), so
// that one can be killed and restarted while sagas are in flight.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/google/uuid"

	"github.com/sagabox/sagabox/orchestrator"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// options are the command-line flags.
type options struct {
	orders       int
	placers      int
	maxRunning   int
	place        bool
	rate         float64
	failRate     float64
	databaseURL  string
	auditURL     string
	amqpURL      string
	service      string
	runID        string
	namespace    string
	schemaPrefix string
	timeout      time.Duration
	metricsAddr  string
	trace        bool
	verbose      bool
	relayMode    string
	setup        bool
	setupOnly    bool

	confirmTimeout time.Duration
	webhookAddr    string
	webhookURL     string
}

// The webhook's address when the orders and payment services run as
// separate processes and -webhook-addr, -webhook-url are not given.
const (
	defaultWebhookAddr = "127.0.0.1:7081"
	defaultWebhookURL  = "http://" + defaultWebhookAddr + "/webhooks/payment"
)

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("checkout", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.orders, "orders", 20, "number of orders to place")
	fs.IntVar(&o.placers, "placers", 1, "how many orders are placed at once (more: a burst)")
	fs.IntVar(&o.maxRunning, "max-running", 0, "flow control: most checkout sagas running at once (0: the orchestrator's default; -1: no limit)")
	fs.BoolVar(&o.place, "place", true, "orders service: place the orders and wait for their sagas (false: only run the orchestrator, as a further instance)")
	fs.Float64Var(&o.rate, "rate", 0, "orders placed per second (0: as fast as they go)")
	fs.Float64Var(&o.failRate, "fail-rate", 0.3, "fraction of orders planned to be compensated (0..1, rounded to a number of orders): rejected by inventory, payment or shipping, or never confirmed by the payment provider")
	fs.StringVar(&o.databaseURL, "database-url", envOr("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"), "PostgreSQL URL, given to pgx as it is; TLS: sslmode=verify-full&sslrootcert=CA.pem[&sslcert=…&sslkey=…] (env DATABASE_URL)")
	fs.StringVar(&o.auditURL, "audit-database-url", "", "orders service: the PostgreSQL URL of the auditor that checks the invariants across every service's schema, a role that may read them all (default: -database-url)")
	fs.StringVar(&o.amqpURL, "amqp-url", envOr("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"), "RabbitMQ URL, or comma-separated URLs of the nodes of a cluster, tried in turn; TLS: amqps://…?cacertfile=CA.pem[&certfile=…&keyfile=…] (env AMQP_URL)")
	fs.BoolVar(&o.setup, "setup", true, "apply the migrations and create the tables of this process's services before running them (false: they are set up already, by -setup-only as the schemas' owner; a service's runtime role may create nothing)")
	fs.BoolVar(&o.setupOnly, "setup-only", false, "apply the migrations and create the tables of this process's services, then exit (run it as the schemas' owner)")
	fs.StringVar(&o.service, "service", "all", "which service to run: all, orders, inventory, payment, shipping or loyalty")
	fs.StringVar(&o.runID, "run-id", "", "identifies this run's customers and products; processes of one run share it (default: random)")
	fs.StringVar(&o.namespace, "namespace", "checkout", "RabbitMQ namespace (prefix of exchanges and queues)")
	fs.StringVar(&o.schemaPrefix, "schema-prefix", "", "prefix of the services' schema names")
	fs.DurationVar(&o.timeout, "timeout", 2*time.Minute, "how long orders waits for every saga to end")
	fs.StringVar(&o.metricsAddr, "metrics-addr", "", "serve Prometheus metrics at this address (e.g. :9464)")
	fs.BoolVar(&o.trace, "trace", false, "print the spans of one saga's trace")
	fs.BoolVar(&o.verbose, "v", false, "log at info level")
	fs.StringVar(&o.relayMode, "relay-mode", "poll", "how the services' relays find their outbox rows: poll, or log (logical replication: needs wal_level = logical)")
	fs.DurationVar(&o.confirmTimeout, "confirm-timeout", 5*time.Second, "how long a checkout waits for the payment provider's confirmation before it compensates")
	fs.StringVar(&o.webhookAddr, "webhook-addr", "", "orders service: serve the payment provider's webhook at this address (default: a free port with -service all, else "+defaultWebhookAddr+")")
	fs.StringVar(&o.webhookURL, "webhook-url", "", "payment service: the orders service's webhook URL, or comma-separated URLs of its instances, tried in turn (default: the in-process one with -service all, else "+defaultWebhookURL+")")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	switch o.service {
	case "all", "orders", "inventory", "payment", "shipping", "loyalty":
	default:
		return nil, fmt.Errorf("-service %q: want all, orders, inventory, payment, shipping or loyalty", o.service)
	}
	if o.relayMode != string(orchestrator.RelayModePoll) && o.relayMode != string(orchestrator.RelayModeLog) {
		return nil, fmt.Errorf("-relay-mode %q: want poll or log", o.relayMode)
	}
	if o.failRate < 0 || o.failRate > 1 {
		return nil, fmt.Errorf("-fail-rate %v: want a fraction between 0 and 1", o.failRate)
	}
	if o.placers < 1 {
		return nil, fmt.Errorf("-placers %d: want 1 or more", o.placers)
	}
	if o.rate < 0 {
		return nil, fmt.Errorf("-rate %v: want 0 or more", o.rate)
	}
	if o.confirmTimeout <= 0 {
		return nil, fmt.Errorf("-confirm-timeout %v: want a positive duration", o.confirmTimeout)
	}
	if o.orders < 0 {
		return nil, fmt.Errorf("-orders %d: want 0 or more", o.orders)
	}
	if o.runID == "" {
		o.runID = strings.ReplaceAll(uuid.NewString(), "-", "")[:8]
	}
	return o, nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "checkout:", err)
		return 2
	}
	level := slog.LevelWarn
	if o.verbose {
		level = slog.LevelInfo
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	app, err := newApp(ctx, o, stdout, logger)
	if err != nil {
		fmt.Fprintln(stderr, "checkout:", err)
		return 1
	}
	defer app.close()
	if err := app.run(ctx); err != nil {
		fmt.Fprintln(stderr, "checkout:", err)
		return 1
	}
	return 0
}
