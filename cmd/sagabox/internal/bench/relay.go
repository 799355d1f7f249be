// Package bench measures sagabox against baselines measured in the same run
// on the same machine, so that results are read as ratios: the relay
// against the raw ceilings it sits between (the broker's pipelined-confirm
// publish rate and PostgreSQL's single-row commit rate), and saga pipelines
// against a hand-written one. It drives sagabox through its public API, as
// a user's service does.
package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/participant"
	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/transport"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

// RelayConfig configures RunRelay.
type RelayConfig struct {
	// DatabaseURL and AMQPURL locate the services.
	DatabaseURL, AMQPURL string
	// PublishCount is the number of messages of the raw publish measurement.
	PublishCount int
	// Backlog is the number of rows drained by the relay drain measurement.
	Backlog int
	// CommitWriters is the number of concurrent writers of the raw commit
	// measurement.
	CommitWriters int
	// Duration is how long each timed measurement runs.
	Duration time.Duration
	// ProcessedRows is the size of the backlog of old published rows for the
	// "hop stays flat" measurement.
	ProcessedRows int
	// LatencyRate, when positive, replaces the rate of the latency
	// measurements (by default half the saturated rate).
	LatencyRate float64
	// Modes are the relay modes measured side by side, in this order;
	// default participant.RelayModePoll only. participant.RelayModeLog needs
	// a server with wal_level = logical.
	Modes []participant.RelayMode
	// Log receives progress lines.
	Log io.Writer
}

// RelayReport is what RunRelay measured.
type RelayReport struct {
	RawPublishPerSec  float64
	RawCommitPerSec   float64
	DrainPerSec       float64
	LatencyRatePerSec float64
	// RawHop is publish→consume latency of single messages published
	// straight to the broker at LatencyRatePerSec: the floor under Latency.
	RawHop         Percentiles
	Latency        Percentiles
	LatencyOldRows Percentiles
	ProcessedRows  int
	// Modes are the drain and latency of each relay mode measured, in
	// the order of RelayConfig.Modes; DrainPerSec and Latency above are the
	// first mode's.
	Modes []ModeReport

	// namespace is the run's RabbitMQ namespace, deleted when it ends.
	namespace string
}

// ModeReport is what RunRelay measured of one relay mode.
type ModeReport struct {
	Mode        participant.RelayMode
	DrainPerSec float64
	// DrainCPU is the CPU time per drained message of PostgreSQL (the
	// server's postmaster and its children), RabbitMQ (every RabbitMQ
	// process on the machine) and this process (the relay and the sink
	// consumer), from /proc.
	DrainCPU cpuTimes
	// LatencyRatePerSec is the rate of its latency run: half its drain
	// rate, or RelayConfig.LatencyRate.
	LatencyRatePerSec float64
	Latency           Percentiles
}

// Percentiles of commit→consume latency.
type Percentiles struct {
	N             int
	P50, P99, Max time.Duration
}

func percentiles(d []time.Duration) Percentiles {
	if len(d) == 0 {
		return Percentiles{}
	}
	slices.Sort(d)
	at := func(q float64) time.Duration { return d[min(len(d)-1, int(q*float64(len(d))))] }
	return Percentiles{N: len(d), P50: at(0.50), P99: at(0.99), Max: d[len(d)-1]}
}

type benchPayload struct {
	N int `json:"n"`
}

// RunRelay runs every measurement and returns the report.
func RunRelay(ctx context.Context, cfg RelayConfig) (*RelayReport, error) {
	logf := func(format string, args ...any) {
		if cfg.Log != nil {
			fmt.Fprintf(cfg.Log, format+"\n", args...)
		}
	}
	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("connect to postgres: %w", store.ExplainParseError(cfg.DatabaseURL, err))
	}
	defer pool.Close()
	suffix := uuid.NewString()[:8]
	schema := "bench_" + suffix
	st, err := store.New(pool, schema)
	if err != nil {
		return nil, err
	}
	defer pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE") //nolint:errcheck
	if _, err := st.MigrateUp(ctx, store.LineMessaging); err != nil {
		return nil, err
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	// A namespace of its own: two runs at once do not share a sink, and
	// what the run declared is deleted when it ends.
	ns := "sagabox-bench-relay-" + suffix
	broker, err := rabbitmq.New(ctx, rabbitmq.Config{URL: cfg.AMQPURL, Namespace: ns, ConnectionName: ns, Logger: quiet})
	if err != nil {
		return nil, err
	}
	defer func() {
		_ = broker.Close()
		deleteTopology(cfg.AMQPURL, broker)
	}()
	spec := transport.QueueSpec{Name: "sink", Events: []string{"bench.#"}}
	if err := broker.Declare(ctx, spec); err != nil {
		return nil, err
	}

	// The sink consumes everything and reports each arrival.
	arrivals := make(chan uuid.UUID, 1<<16)
	var consumed atomic.Int64
	subCtx, stopSub := context.WithCancel(ctx)
	subDone := make(chan error, 1)
	go func() {
		subDone <- broker.Subscribe(subCtx, spec, transport.HandlerFunc(func(_ context.Context, d *transport.Delivery) transport.Outcome {
			consumed.Add(1)
			select {
			case arrivals <- d.MessageID:
			default:
			}
			return transport.Ack()
		}), &transport.SubscribeOpts{Concurrency: 4, Prefetch: 1000})
	}()
	defer func() {
		stopSub()
		if err := <-subDone; err != nil {
			logf("subscriber stopped with an error: %v", err)
		}
	}()
	waitConsumed := func(target int64, timeout time.Duration) error {
		deadline := time.Now().Add(timeout)
		for consumed.Load() < target {
			if time.Now().After(deadline) {
				return fmt.Errorf("consumed %d of %d within %s", consumed.Load(), target, timeout)
			}
			time.Sleep(2 * time.Millisecond)
		}
		return nil
	}
	drainArrivals := func() {
		for {
			select {
			case <-arrivals:
			default:
				return
			}
		}
	}

	rep := &RelayReport{ProcessedRows: cfg.ProcessedRows, namespace: ns}

	// 1. Raw pipelined-confirm publish rate.
	logf("raw publish: %d messages, batches of 500, pipelined confirms", cfg.PublishCount)
	msgs := make([]message.Message, 500)
	for i := range msgs {
		msgs[i] = message.Message{Envelope: message.Envelope{
			Version: 1, Type: "bench.event", Kind: message.KindEvent, RoutingKey: "bench.event", CreatedAt: time.Now(),
		}, Payload: []byte(`{"n":0}`)}
	}
	base := consumed.Load()
	start := time.Now()
	for sent := 0; sent < cfg.PublishCount; sent += len(msgs) {
		for i := range msgs {
			msgs[i].MessageID = uuid.New()
		}
		if err := broker.Publish(ctx, msgs...); err != nil {
			return nil, fmt.Errorf("raw publish: %w", err)
		}
	}
	rep.RawPublishPerSec = float64(cfg.PublishCount) / time.Since(start).Seconds()
	if err := waitConsumed(base+int64(cfg.PublishCount), time.Minute); err != nil {
		return nil, err
	}
	drainArrivals()

	// 2. Raw single-row insert commit rate (no relay running).
	logf("raw commits: %d writers for %s", cfg.CommitWriters, cfg.Duration)
	writer, err := relayClient(pool, schema, broker, participant.RelayConfig{})
	if err != nil {
		return nil, err
	}
	if rep.RawCommitPerSec, err = rawCommits(ctx, pool, writer, schema, cfg.CommitWriters, cfg.Duration); err != nil {
		return nil, err
	}

	// 3 and 4, per mode: drain a pre-filled backlog, then commit→consume
	// latency at half the saturated rate of the whole path (the slower of
	// the relay's drain and the database's commits).
	modes := cfg.Modes
	if len(modes) == 0 {
		modes = []participant.RelayMode{participant.RelayModePoll}
	}
	polling := false
	for _, mode := range modes {
		mr, stop, err := measureMode(ctx, cfg, mode, pool, st, broker, &consumed, arrivals, waitConsumed, drainArrivals, rep.RawCommitPerSec, logf)
		if err != nil {
			return nil, err
		}
		stop()
		rep.Modes = append(rep.Modes, mr)
		if mode == modes[0] {
			rep.DrainPerSec, rep.Latency, rep.LatencyRatePerSec = mr.DrainPerSec, mr.Latency, mr.LatencyRatePerSec
		}
		polling = polling || mode == participant.RelayModePoll
	}
	if rep.RawHop, err = measureRawHop(ctx, broker, arrivals, rep.LatencyRatePerSec, cfg.Duration); err != nil {
		return nil, err
	}
	if !polling {
		return rep, nil
	}
	rl, err := relayClient(pool, schema, broker, participant.RelayConfig{BatchSize: 500, Workers: 4, PollInterval: 100 * time.Millisecond})
	if err != nil {
		return nil, err
	}
	relayCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- rl.Run(relayCtx) }()
	defer func() {
		stopRelay()
		if err := <-relayDone; err != nil {
			logf("relay stopped with an error: %v", err)
		}
	}()

	// 5. The same with a large backlog of old published rows.
	logf("latency with %d old published rows", cfg.ProcessedRows)
	if _, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.sagabox_outbox (message_id, ordering_key, kind, type, routing_key, payload, published_at)
		SELECT gen_random_uuid(), g::text, 'event', 'old.event', 'old.event', '{}'::bytea, now() - interval '1 hour' FROM generate_series(1, %d) g`,
		pgx.Identifier{schema}.Sanitize(), cfg.ProcessedRows)); err != nil {
		return nil, fmt.Errorf("insert old rows: %w", err)
	}
	// Steady state: autovacuum has seen the old rows (as it would have long
	// before in production), so it does not compete with the measurement.
	if _, err := pool.Exec(ctx, fmt.Sprintf("VACUUM ANALYZE %s.sagabox_outbox", pgx.Identifier{schema}.Sanitize())); err != nil {
		return nil, err
	}
	if rep.LatencyOldRows, err = measureLatency(ctx, pool, rl, arrivals, rep.LatencyRatePerSec, cfg.Duration); err != nil {
		return nil, err
	}
	return rep, nil
}

// relayClient returns a participant client of schema whose relay, tuned
// by relay, publishes the outbox to broker: the relay as a service runs it.
// It handles no command of the bench's; it consumes a queue of its own.
func relayClient(pool *pgxpool.Pool, schema string, broker *rabbitmq.Broker, relay participant.RelayConfig) (*participant.Client, error) {
	c, err := participant.NewClient(participant.Config{
		Pool: pool, Schema: schema, Service: "relay-bench", Broker: broker, Relay: relay,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		return nil, err
	}
	participant.HandleEvent(c, "relay-bench.unused", func(context.Context, pgx.Tx, *participant.Request[json.RawMessage]) error { return nil })
	return c, nil
}

// measureMode drains a backlog of cfg.Backlog rows (written in
// transactions of 1,000) with a relay in mode, with the CPU it cost, then
// measures commit→consume latency at half the saturated rate. It returns
// how to stop the relay (and, in log mode, drop its slot).
func measureMode(ctx context.Context, cfg RelayConfig, mode participant.RelayMode, pool *pgxpool.Pool, st *store.Store, broker *rabbitmq.Broker,
	consumed *atomic.Int64, arrivals <-chan uuid.UUID, waitConsumed func(int64, time.Duration) error, drainArrivals func(),
	rawCommitPerSec float64, logf func(string, ...any),
) (ModeReport, func(), error) {
	mr := ModeReport{Mode: mode}
	schema := pgx.Identifier{st.Schema()}.Sanitize()
	opts := participant.RelayConfig{Mode: mode, BatchSize: 500, Workers: 4, PollInterval: 100 * time.Millisecond}
	cleanup := func() {}
	if mode == participant.RelayModeLog {
		if _, err := st.SetupOutboxLog(ctx, store.OutboxLogNames{}); err != nil {
			return mr, nil, err
		}
		cleanup = func() {
			if err := st.DropOutboxLog(context.WithoutCancel(ctx), store.OutboxLogNames{}); err != nil {
				logf("drop the replication slot: %v", err)
			}
		}
	}
	logf("%s relay drain: pre-filling %d rows", mode, cfg.Backlog)
	for done := 0; done < cfg.Backlog; done += 1000 {
		n := min(1000, cfg.Backlog-done)
		if _, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.sagabox_outbox (message_id, ordering_key, kind, type, routing_key, payload)
			SELECT gen_random_uuid(), g::text, 'event', 'bench.event', 'bench.event', '{"n":0}'::bytea FROM generate_series(1, %d) g`,
			schema, n)); err != nil {
			cleanup()
			return mr, nil, fmt.Errorf("pre-fill backlog: %w", err)
		}
	}
	// No ANALYZE: the claim's plan must stay bounded by the batch on a
	// backlog the planner has never seen, as after an outage.
	rl, err := relayClient(pool, st.Schema(), broker, opts)
	if err != nil {
		cleanup()
		return mr, nil, err
	}
	relayCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	stop := func() {
		stopRelay()
		if err := <-relayDone; err != nil {
			logf("relay stopped with an error: %v", err)
		}
		cleanup()
	}
	base := consumed.Load()
	cpu0, err := readCPUOf(ctx, pool)
	if err != nil {
		cleanup()
		return mr, nil, err
	}
	start := time.Now()
	go func() { relayDone <- rl.Run(relayCtx) }()
	if err := waitConsumed(base+int64(cfg.Backlog), 5*time.Minute); err != nil {
		stop()
		return mr, nil, fmt.Errorf("%s drain: %w", mode, err)
	}
	mr.DrainPerSec = float64(cfg.Backlog) / time.Since(start).Seconds()
	cpu1, err := readCPUOf(ctx, pool)
	if err != nil {
		stop()
		return mr, nil, err
	}
	used := cpu1.sub(cpu0)
	n := time.Duration(cfg.Backlog)
	mr.DrainCPU = cpuTimes{Postgres: used.Postgres / n, RabbitMQ: used.RabbitMQ / n, Go: used.Go / n}
	drainArrivals()
	// Steady state for the latency runs: the drain left its dead tuples
	// (and, polling, its rows) behind, which autovacuum would otherwise
	// clean up during them.
	if _, err := pool.Exec(ctx, fmt.Sprintf("DELETE FROM %s.sagabox_outbox", schema)); err != nil {
		stop()
		return mr, nil, err
	}
	if _, err := pool.Exec(ctx, fmt.Sprintf("VACUUM ANALYZE %s.sagabox_outbox", schema)); err != nil {
		stop()
		return mr, nil, err
	}
	mr.LatencyRatePerSec = min(mr.DrainPerSec, rawCommitPerSec) / 2
	if cfg.LatencyRate > 0 {
		mr.LatencyRatePerSec = cfg.LatencyRate
	}
	logf("%s relay latency: %.0f msg/s for %s", mode, mr.LatencyRatePerSec, cfg.Duration)
	if mr.Latency, err = measureLatency(ctx, pool, rl, arrivals, mr.LatencyRatePerSec, cfg.Duration); err != nil {
		stop()
		return mr, nil, err
	}
	return mr, stop, nil
}

func benchMessage(n int) message.Message {
	body, _ := json.Marshal(benchPayload{N: n})
	return message.Message{Envelope: message.Envelope{Type: "bench.event", Kind: message.KindEvent}, Payload: body}
}

// measureRawHop publishes single messages straight to the broker (confirmed
// one by one, several publishers in parallel) at rate for d and returns the
// publish→consume latency: what the broker alone costs per hop.
func measureRawHop(ctx context.Context, broker transport.Publisher, arrivals <-chan uuid.UUID, rate float64, d time.Duration) (Percentiles, error) {
	return measureHops(ctx, arrivals, rate, d, func(ctx context.Context, i int) (uuid.UUID, time.Time, error) {
		m := benchMessage(i)
		m.Version, m.MessageID, m.RoutingKey, m.CreatedAt = message.Version, uuid.Must(uuid.NewV7()), m.Type, time.Now()
		start := time.Now()
		return m.MessageID, start, broker.Publish(ctx, m)
	})
}

// measureLatency commits single-row transactions at rate for d, through
// the public Publish of rl, a running participant client, and waking its
// relay after each commit as the documentation says to, and returns the
// commit→consume latency distribution.
func measureLatency(ctx context.Context, pool *pgxpool.Pool, rl *participant.Client, arrivals <-chan uuid.UUID, rate float64, d time.Duration) (Percentiles, error) {
	return measureHops(ctx, arrivals, rate, d, func(ctx context.Context, i int) (uuid.UUID, time.Time, error) {
		msg := benchMessage(i)
		msg.MessageID = uuid.Must(uuid.NewV7())
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return rl.Publish(ctx, tx, msg) }); err != nil {
			return uuid.Nil, time.Time{}, err
		}
		committed := time.Now()
		rl.Wake()
		return msg.MessageID, committed, nil
	})
}

// measureHops calls send rate times a second for d, from several goroutines
// so that the offered rate does not depend on one call's round trip, and
// returns the distribution of the time from each hop's start (as send
// reports it) to the message's arrival.
func measureHops(ctx context.Context, arrivals <-chan uuid.UUID, rate float64, d time.Duration,
	send func(ctx context.Context, i int) (uuid.UUID, time.Time, error),
) (Percentiles, error) {
	total := int(rate * d.Seconds())
	var mu sync.Mutex
	started := make(map[uuid.UUID]time.Time, total)
	arrived := make(map[uuid.UUID]time.Time, total)
	collected := make(chan struct{})
	stop := make(chan struct{})
	go func() {
		defer close(collected)
		for {
			select {
			case id := <-arrivals:
				mu.Lock()
				arrived[id] = time.Now()
				mu.Unlock()
			case <-stop:
				return
			}
		}
	}()

	const senders = 8
	interval := time.Duration(float64(time.Second) * senders / rate)
	var wg sync.WaitGroup
	var firstErr atomic.Value
	for w := range senders {
		wg.Go(func() {
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for i := w; i < total; i += senders {
				<-tick.C
				id, at, err := send(ctx, i)
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				mu.Lock()
				started[id] = at
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	// Wait for the last arrivals (a message may even arrive before its
	// sender recorded its start: both are matched at the end).
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		missing := 0
		for id := range started {
			if _, ok := arrived[id]; !ok {
				missing++
			}
		}
		mu.Unlock()
		if missing == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(stop)
	<-collected
	if err, ok := firstErr.Load().(error); ok {
		return Percentiles{}, err
	}
	latencies := make([]time.Duration, 0, len(started))
	for id, at := range started {
		if got, ok := arrived[id]; ok {
			latencies = append(latencies, got.Sub(at))
		}
	}
	if len(latencies) < len(started) {
		return Percentiles{}, fmt.Errorf("%d of %d messages did not arrive within 30 s", len(started)-len(latencies), len(started))
	}
	return percentiles(latencies), nil
}

// Print writes the report with each rate as a ratio of its ceiling.
func (r *RelayReport) Print(w io.Writer) {
	defer r.printModes(w)
	fmt.Fprintf(w, "raw RabbitMQ publish, pipelined confirms : %8.0f msg/s  (baseline)\n", r.RawPublishPerSec)
	fmt.Fprintf(w, "raw single-row insert commits             : %8.0f tx/s   (baseline)\n", r.RawCommitPerSec)
	fmt.Fprintf(w, "relay drain of a pre-filled backlog        : %8.0f msg/s  = %.2f × raw publish\n", r.DrainPerSec, r.DrainPerSec/r.RawPublishPerSec)
	fmt.Fprintf(w, "raw publish→consume at %6.0f msg/s      : p50 %v  p99 %v  max %v  (n=%d)  (baseline: the broker hop)\n", r.LatencyRatePerSec, r.RawHop.P50.Round(10*time.Microsecond), r.RawHop.P99.Round(10*time.Microsecond), r.RawHop.Max.Round(10*time.Microsecond), r.RawHop.N)
	fmt.Fprintf(w, "commit→consume at %6.0f msg/s              : p50 %v  p99 %v  max %v  (n=%d)\n", r.LatencyRatePerSec, r.Latency.P50.Round(10*time.Microsecond), r.Latency.P99.Round(10*time.Microsecond), r.Latency.Max.Round(10*time.Microsecond), r.Latency.N)
	fmt.Fprintf(w, "same with %d old published rows      : p50 %v  p99 %v  max %v  (n=%d)\n", r.ProcessedRows, r.LatencyOldRows.P50.Round(10*time.Microsecond), r.LatencyOldRows.P99.Round(10*time.Microsecond), r.LatencyOldRows.Max.Round(10*time.Microsecond), r.LatencyOldRows.N)
	if r.RawHop.P50 > 0 {
		fmt.Fprintf(w, "commit→consume p50 / raw broker hop p50    : %.2f\n", float64(r.Latency.P50)/float64(r.RawHop.P50))
	}
	if r.Latency.P50 > 0 {
		fmt.Fprintf(w, "p50 with old rows / p50 without           : %.2f\n", float64(r.LatencyOldRows.P50)/float64(r.Latency.P50))
	}
}

// printModes writes the modes side by side, when more than one was measured.
func (r *RelayReport) printModes(w io.Writer) {
	if len(r.Modes) < 2 {
		return
	}
	fmt.Fprintln(w, "")
	fmt.Fprintln(w, "mode  drain msg/s  × raw publish  CPU µs/msg: PostgreSQL  RabbitMQ  relay+sink  latency rate  p50       p99")
	for _, m := range r.Modes {
		us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }
		fmt.Fprintf(w, "%-4s  %11.0f  %13.2f  %21.1f  %8.1f  %10.1f  %12.0f  %-8v  %v\n", m.Mode, m.DrainPerSec, m.DrainPerSec/r.RawPublishPerSec,
			us(m.DrainCPU.Postgres), us(m.DrainCPU.RabbitMQ), us(m.DrainCPU.Go), m.LatencyRatePerSec,
			m.Latency.P50.Round(10*time.Microsecond), m.Latency.P99.Round(10*time.Microsecond))
	}
}
