package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/participant"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/transport"
	"github.com/sagabox/sagabox/transport/rabbitmq"
	"go.opentelemetry.io/otel/trace"
)

type benchData struct {
	N int `json:"n"`
}

var (
	benchStep1 = saga.NewCommand[benchData, saga.None]("bench.one")
	benchStep2 = saga.NewCommand[benchData, saga.None]("bench.two")
	benchStep3 = saga.NewCommand[benchData, saga.None]("bench.three")
)

// benchSaga is the engine's three-step saga: alpha handles steps one and
// three, beta step two, like the baseline's.
var benchSaga = saga.MustNew("bench", 1,
	saga.Step("one", saga.Invoke(benchStep1, func(d *benchData) benchData { return *d }, nil)),
	saga.Step("two", saga.Invoke(benchStep2, func(d *benchData) benchData { return *d }, nil)),
	saga.Step("three", saga.Invoke(benchStep3, func(d *benchData) benchData { return *d }, nil)),
)

// openEngine runs sagabox on the benchmark's work: an orchestrator and two
// participant clients in this process, sharing one pool of cfg.PoolSize
// connections and one broker, each with its own schema, handlers that only
// return success. With replicas > 0 the orchestrator runs instead in that
// many processes of its own (startReplicas), each with its own pool and
// broker connection, on the same schema and queues; this process starts
// the sagas through a client that runs nothing and wakes the replicas'
// relays with NOTIFY (orchestrator.RelayConfig.Notify), the way a web
// process that starts sagas does.
func openEngine(ctx context.Context, cfg SagaConfig, replicas int) (_ *pipeline, err error) {
	var undo []func()
	closeAll := func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	defer func() {
		if err != nil {
			closeAll()
		}
	}()
	pool, err := newPool(ctx, cfg.DatabaseURL, cfg.PoolSize)
	if err != nil {
		return nil, err
	}
	undo = append(undo, pool.Close)
	suffix := uuid.NewString()[:8]
	schemas := map[string]string{}
	for _, svc := range baselineServices {
		schema := "bench_engine_" + svc + "_" + suffix
		st, err := store.New(pool, schema)
		if err != nil {
			return nil, err
		}
		if !cfg.KeepSchemas {
			undo = append(undo, func() { dropSchema(pool, schema) })
		}
		lines := []store.Line{store.LineMessaging}
		if svc == svcOrch {
			lines = nil // all lines
		}
		if _, err := st.MigrateUp(ctx, lines...); err != nil {
			return nil, fmt.Errorf("migrate engine schema %s: %w", schema, err)
		}
		schemas[svc] = schema
	}

	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if cfg.Log != nil {
		logger = slog.New(slog.NewTextHandler(cfg.Log, &slog.HandlerOptions{Level: slog.LevelError}))
	}
	ns := "sagabox-bench-engine-" + suffix
	broker, err := rabbitmq.New(ctx, rabbitmq.Config{
		URL: cfg.AMQPURL, Namespace: ns, QueueType: cfg.QueueType, ConnectionName: ns, Logger: logger,
	})
	if err != nil {
		return nil, fmt.Errorf("connect engine broker: %w", err)
	}
	undo = append(undo, func() {
		_ = broker.Close()
		deleteTopology(cfg.AMQPURL, broker)
	})

	orchCfg := orchestrator.Config{
		Pool: pool, Schema: schemas[svcOrch], Service: svcOrch, Broker: broker,
		Definitions: []saga.Runner{benchSaga}, Workers: cfg.Workers, Logger: logger, TracerProvider: probeTP,
		Admission: orchestrator.AdmissionConfig{MaxRunning: cfg.MaxRunning}, BatchLinger: cfg.Linger,
	}
	if replicas > 0 {
		orchCfg.Broker = nil // a starter: it runs nothing
		orchCfg.Relay.Notify = true
	}
	orch, err := orchestrator.NewClient(orchCfg)
	if err != nil {
		return nil, err
	}
	ok := func(context.Context, pgx.Tx, *participant.Request[benchData]) (saga.None, error) {
		return saga.None{}, nil
	}
	alpha, err := participant.NewClient(participant.Config{Pool: pool, Schema: schemas[svcAlpha], Service: svcAlpha, Broker: broker, Workers: cfg.Workers, MaxBatch: cfg.ParticipantBatch, BatchLinger: cfg.Linger, Logger: logger, TracerProvider: probeTP})
	if err != nil {
		return nil, err
	}
	participant.HandleCommand(alpha, benchStep1, ok)
	participant.HandleCommand(alpha, benchStep3, ok)
	beta, err := participant.NewClient(participant.Config{Pool: pool, Schema: schemas[svcBeta], Service: svcBeta, Broker: broker, Workers: cfg.Workers, MaxBatch: cfg.ParticipantBatch, BatchLinger: cfg.Linger, Logger: logger, TracerProvider: probeTP})
	if err != nil {
		return nil, err
	}
	participant.HandleCommand(beta, benchStep2, ok)

	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	errs := make(chan error, 3+replicas)
	clients := []interface{ Run(context.Context) error }{alpha, beta}
	if replicas == 0 {
		clients = append(clients, orch)
	}
	for _, r := range clients {
		wg.Go(func() {
			if err := r.Run(runCtx); err != nil {
				errs <- fmt.Errorf("engine client stopped: %w", err)
			}
		})
	}
	undo = append(undo, func() { stop(); wg.Wait() })
	var children []int
	if replicas > 0 {
		// Declared here too, so that deleteTopology deletes it.
		if err := broker.Declare(ctx, transport.QueueSpec{Name: svcOrch, Replies: true}); err != nil {
			return nil, fmt.Errorf("declare the orchestrator's reply queue: %w", err)
		}
		spec := ReplicaSpec{
			DatabaseURL: cfg.DatabaseURL, AMQPURL: cfg.AMQPURL, Schema: schemas[svcOrch], Namespace: ns,
			QueueType: string(cfg.QueueType), PoolSize: cfg.PoolSize, Workers: cfg.Workers,
			Linger: cfg.Linger, MaxRunning: cfg.MaxRunning,
		}
		reps, err := startReplicas(ctx, cfg.ReplicaCommand, spec, replicas, errs)
		if err != nil {
			return nil, err
		}
		undo = append(undo, reps.stop)
		if err := awaitConsumers(ctx, cfg.AMQPURL, broker.QueueName(svcOrch), replicas, errs); err != nil {
			return nil, err
		}
		children = reps.pids()
	}

	// The completion poll reads the saga table itself, through its status
	// index: the view computes columns per row that the poll does not need,
	// and its cost would count as the engine's.
	sagas := pgx.Identifier{schemas[svcOrch], "sagabox_saga"}.Sanitize()
	name := PipelineEngine
	if replicas > 0 {
		name = replicasName(replicas)
	}
	return &pipeline{
		name: name,
		pool: pool,
		start: func(ctx context.Context) (uuid.UUID, error) {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return uuid.Nil, fmt.Errorf("begin: %w", err)
			}
			defer tx.Rollback(ctx)
			started, err := orchestrator.Start(ctx, orch, tx, benchSaga, benchData{N: 1}, nil)
			if err != nil {
				return uuid.Nil, err
			}
			if err := tx.Commit(ctx); err != nil {
				return uuid.Nil, fmt.Errorf("commit start of saga %s: %w", started.ID, err)
			}
			orch.Wake()
			return started.ID, nil
		},
		countSQL: "SELECT count(*) FROM " + sagas + " WHERE status = 'completed'",
		doneSQL:  "SELECT id, finished_at FROM " + sagas + " WHERE status = 'completed'",
		errs:     errs,
		children: children,
		close:    closeAll,
	}, nil
}

// deleteTopology deletes the exchanges of broker's namespace and the
// queues declared through it, with their dead-letter and retry queues (best
// effort: the run is over).
func deleteTopology(url string, broker *rabbitmq.Broker) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	defer func() { _ = ch.Close() }()
	for _, q := range broker.DeclaredQueues() {
		names := []string{broker.QueueName(q), broker.DeadLetterQueueName(q)}
		for _, d := range rabbitmq.RetryDelays() {
			names = append(names, broker.RetryQueueName(q, d))
		}
		for _, name := range names {
			_, _ = ch.QueueDelete(name, false, false, false)
		}
	}
	for _, x := range []string{transport.ExchangeCommands, transport.ExchangeReplies, transport.ExchangeEvents, rabbitmq.ExchangeDeadLetter} {
		_ = ch.ExchangeDelete(broker.ExchangeName(x), false, false)
	}
}

var probeTP trace.TracerProvider
