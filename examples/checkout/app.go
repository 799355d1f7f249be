package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sagabox/sagabox/examples/checkout/contract"
	"github.com/sagabox/sagabox/examples/checkout/inventory"
	"github.com/sagabox/sagabox/examples/checkout/loyalty"
	"github.com/sagabox/sagabox/examples/checkout/orders"
	"github.com/sagabox/sagabox/examples/checkout/payment"
	"github.com/sagabox/sagabox/examples/checkout/shipping"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/participant"
	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

// app is one process of the example: all services, or one.
type app struct {
	o      *options
	out    io.Writer
	log    *slog.Logger
	pool   *pgxpool.Pool
	broker *rabbitmq.Broker
	// audit is the auditor's pool (-audit-database-url); nil: pool.
	audit *pgxpool.Pool
	obs   *observability

	orders    *orders.Service
	inventory *inventory.Service
	payment   *payment.Service
	shipping  *shipping.Service
	loyalty   *loyalty.Service

	// webhookURL is the orders service's webhook, once it serves it.
	webhookURL string
}

const (
	pgStartHint     = "start it with: pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"
	rabbitStartHint = "start it with: rabbitmq-server -detached"
)

func newApp(ctx context.Context, o *options, out io.Writer, log *slog.Logger) (*app, error) {
	a := &app{
		o: o, out: out, log: log,
		orders:    orders.New(orders.Config{Schema: o.schemaPrefix + contract.ServiceOrders, ConfirmTimeout: o.confirmTimeout}),
		inventory: inventory.New(o.schemaPrefix + contract.ServiceInventory),
		payment:   payment.New(o.schemaPrefix + contract.ServicePayment),
		shipping:  shipping.New(o.schemaPrefix + contract.ServiceShipping),
		loyalty:   loyalty.New(o.schemaPrefix + contract.ServiceLoyalty),
	}
	pool, err := openPool(ctx, "-database-url", o.databaseURL)
	if err != nil {
		return nil, err
	}
	a.pool = pool
	if o.setupOnly {
		return a, nil
	}
	if o.auditURL != "" {
		if a.audit, err = openPool(ctx, "-audit-database-url", o.auditURL); err != nil {
			a.close()
			return nil, err
		}
	}
	dialCtx, cancelDial := context.WithTimeout(ctx, 15*time.Second)
	defer cancelDial()
	urls := splitURLs(o.amqpURL)
	broker, err := rabbitmq.New(dialCtx, rabbitmq.Config{
		URL: urls[0], URLs: urls[1:], Namespace: o.namespace, ConnectionName: "checkout-" + o.service, Logger: log,
	})
	if err != nil {
		a.close()
		hosts := make([]string, len(urls))
		for i, u := range urls {
			hosts[i] = redactURL(u)
		}
		return nil, fmt.Errorf("cannot connect to RabbitMQ at %s: %w", strings.Join(hosts, ", "), err)
	}
	a.broker = broker
	if a.obs, err = newObservability(o, out); err != nil {
		a.close()
		return nil, err
	}
	return a, nil
}

// openPool opens a pool on the PostgreSQL of url (the value of flag) and
// checks that it answers. Its errors never hold the URL's password.
func openPool(ctx context.Context, flag, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, store.ExplainParseError(url, err))
	}
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open PostgreSQL pool: %w", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		host := fmt.Sprintf("%s:%d", cfg.ConnConfig.Host, cfg.ConnConfig.Port)
		switch store.ClassifyConnect(err) {
		case store.ConnectUnreachable:
			return nil, fmt.Errorf("PostgreSQL is unreachable at %s (%w); is it running? %s", host, err, pgStartHint)
		case store.ConnectCertificate:
			return nil, fmt.Errorf("cannot connect to PostgreSQL at %s (%s): %w", host, flag, store.ExplainCertificate(url, err))
		}
		return nil, fmt.Errorf("cannot connect to PostgreSQL at %s (%s): %w", host, flag, err)
	}
	return pool, nil
}

func (a *app) close() {
	if a.obs != nil {
		a.obs.close()
	}
	if a.broker != nil {
		_ = a.broker.Close()
	}
	if a.pool != nil {
		a.pool.Close()
	}
	if a.audit != nil {
		a.audit.Close()
	}
}

// auditor returns the pool of the auditor, which reads every service's
// schema.
func (a *app) auditor() *pgxpool.Pool {
	if a.audit != nil {
		return a.audit
	}
	return a.pool
}

// splitURLs splits a comma-separated list of AMQP URLs at the commas that
// start another URL, so that a comma in a password (which a URL need not
// escape) does not split it.
func splitURLs(list string) []string {
	var urls []string
	for {
		i := -1
		for _, scheme := range []string{",amqp://", ",amqps://"} {
			if j := strings.Index(list, scheme); j >= 0 && (i < 0 || j < i) {
				i = j
			}
		}
		if i < 0 {
			return append(urls, list)
		}
		urls = append(urls, list[:i])
		list = list[i+1:]
	}
}

// redactURL returns the host of the AMQP URL raw, found without ever
// taking part of a password for it.
func redactURL(raw string) string {
	u, err := url.Parse(rabbitmq.RedactURL(raw))
	if err != nil {
		return "(invalid URL)"
	}
	u.User = nil
	return u.Host
}

// setup applies the migrations and creates the business tables of the
// services this process runs. Both are idempotent.
func (a *app) setup(ctx context.Context) error {
	type service struct {
		schema string
		lines  []store.Line
		tables func(context.Context, *pgxpool.Pool) error
	}
	all := map[string]service{
		"orders":    {a.orders.Schema(), store.AllLines, a.orders.Setup},
		"inventory": {a.inventory.Schema(), []store.Line{store.LineMessaging}, a.inventory.Setup},
		"payment":   {a.payment.Schema(), []store.Line{store.LineMessaging}, a.payment.Setup},
		"shipping":  {a.shipping.Schema(), []store.Line{store.LineMessaging}, a.shipping.Setup},
		"loyalty":   {a.loyalty.Schema(), []store.Line{store.LineMessaging}, a.loyalty.Setup},
	}
	for _, name := range a.services() {
		svc := all[name]
		st, err := store.New(a.pool, svc.schema)
		if err != nil {
			return err
		}
		if _, err := st.MigrateUp(ctx, svc.lines...); err != nil {
			return fmt.Errorf("migrate %s: %w", name, err)
		}
		if err := svc.tables(ctx, a.pool); err != nil {
			return err
		}
		if a.o.relayMode == string(orchestrator.RelayModeLog) {
			if _, err := st.SetupOutboxLog(ctx, store.OutboxLogNames{}); err != nil {
				return fmt.Errorf("set up the log relay of %s: %w", name, err)
			}
		}
	}
	return nil
}

func (a *app) services() []string {
	if a.o.service == "all" {
		return []string{"orders", "inventory", "payment", "shipping", "loyalty"}
	}
	return []string{a.o.service}
}

func (a *app) participant(name string, register func(*participant.Client), schema string) (*participant.Client, error) {
	c, err := participant.NewClient(participant.Config{
		Pool: a.pool, Schema: schema, Service: name, Broker: a.broker, Logger: a.log,
		Relay:          participant.RelayConfig{PollInterval: 200 * time.Millisecond, Mode: participant.RelayMode(a.o.relayMode)},
		TracerProvider: a.obs.tracerProvider, MeterProvider: a.obs.meterProvider,
	})
	if err != nil {
		return nil, err
	}
	register(c)
	return c, nil
}

func (a *app) orchestrator() (*orchestrator.Client, error) {
	return orchestrator.NewClient(orchestrator.Config{
		Pool: a.pool, Schema: a.orders.Schema(), Service: contract.ServiceOrders, Broker: a.broker,
		Logger:         a.log,
		Relay:          orchestrator.RelayConfig{PollInterval: 200 * time.Millisecond, Mode: orchestrator.RelayMode(a.o.relayMode)},
		Admission:      orchestrator.AdmissionConfig{MaxRunning: a.o.maxRunning},
		TracerProvider: a.obs.tracerProvider, MeterProvider: a.obs.meterProvider,
	})
}

// serveWebhook serves the orders service's payment webhook (-webhook-addr)
// until the returned function is called.
func (a *app) serveWebhook(ctx context.Context, orch *orchestrator.Client) (func(), error) {
	addr := a.o.webhookAddr
	if addr == "" {
		addr = defaultWebhookAddr
		if a.o.service == "all" {
			addr = "127.0.0.1:0"
		}
	}
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("serve the payment webhook (-webhook-addr): %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle(orders.WebhookPath, a.orders.Webhook(a.pool, orch, a.obs.tracerProvider))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	a.webhookURL = "http://" + ln.Addr().String() + orders.WebhookPath
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}

// webhookURLs are where the payment provider sends its confirmations.
func (a *app) webhookURLs() []string {
	switch {
	case a.o.webhookURL != "":
		return strings.Split(a.o.webhookURL, ",")
	case a.webhookURL != "":
		return []string{a.webhookURL}
	}
	return []string{defaultWebhookURL}
}

// runner is anything with a blocking Run.
type runner interface{ Run(context.Context) error }

// run runs this process's part of the example.
func (a *app) run(ctx context.Context) error {
	if a.o.setup || a.o.setupOnly {
		if err := a.setup(ctx); err != nil {
			return err
		}
	}
	if a.o.setupOnly {
		fmt.Fprintf(a.out, "checkout: %s set up\n", strings.Join(a.services(), ", "))
		return nil
	}
	plan := newPlan(a.o.runID, a.o.orders, a.o.failRate)
	var runners []runner
	var orch *orchestrator.Client
	for _, name := range a.services() {
		var err error
		switch name {
		case "orders":
			orch, err = a.orchestrator()
			if err == nil {
				err = orch.Register(a.orders.Saga)
			}
			if err == nil {
				runners = append(runners, orch)
				var stopWebhook func()
				if stopWebhook, err = a.serveWebhook(ctx, orch); err == nil {
					defer stopWebhook()
				}
			}
		case "inventory":
			var c *participant.Client
			if c, err = a.participant(name, a.inventory.Register, a.inventory.Schema()); err == nil {
				runners = append(runners, c)
				err = plan.seedInventory(ctx, a.pool, a.inventory)
			}
		case "payment":
			var c *participant.Client
			var provider *payment.Provider
			if provider, err = payment.StartProvider(ctx, a.pool, a.payment, payment.ProviderConfig{WebhookURLs: a.webhookURLs(), Logger: a.log}); err != nil {
				break
			}
			defer func() { _ = provider.Close() }()
			a.payment.UseProvider(provider.URL())
			if c, err = a.participant(name, a.payment.Register, a.payment.Schema()); err == nil {
				runners = append(runners, c)
				err = plan.seedPayment(ctx, a.pool, a.payment)
			}
		case "shipping":
			var c *participant.Client
			if c, err = a.participant(name, a.shipping.Register, a.shipping.Schema()); err == nil {
				runners = append(runners, c)
			}
		case "loyalty":
			var c *participant.Client
			if c, err = a.participant(name, a.loyalty.Register, a.loyalty.Schema()); err == nil {
				runners = append(runners, c)
			}
		}
		if err != nil {
			return fmt.Errorf("start %s: %w", name, err)
		}
	}

	runCtx, stopRunners := context.WithCancel(ctx)
	defer stopRunners()
	var wg sync.WaitGroup
	errs := make(chan error, len(runners))
	for _, r := range runners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.Run(runCtx); err != nil {
				errs <- err
				stopRunners()
			}
		}()
	}
	defer wg.Wait()

	if orch == nil || !a.o.place {
		fmt.Fprintf(a.out, "checkout: %s service running (run %s); stop it with Ctrl-C\n", a.o.service, a.o.runID)
		select {
		case <-runCtx.Done():
		case err := <-errs:
			return err
		}
		return nil
	}
	driveErr := a.drive(runCtx, orch, plan, errs)
	stopRunners()
	wg.Wait()
	select {
	case err := <-errs:
		if driveErr == nil && !errors.Is(err, context.Canceled) {
			driveErr = err
		}
	default:
	}
	return driveErr
}
