// Package faulttest runs a service's own sagas under the faults that
// at-least-once delivery really produces, against the real PostgreSQL and
// broker, and checks the invariants the service declares over its own
// tables once every saga has ended.
//
// It is the second layer of testing a saga. saga/sagatest drives a
// definition through scenarios in memory, fast, with a fake clock: it proves
// the saga's logic. faulttest runs the real definitions (package saga), the
// real participant handlers (participant.HandleCommand and friends) and the
// real orchestrator, with their real transactions, and injects faults where
// the transport, the relay and the processes produce them:
//
//   - a published message published again at once (FaultDuplicate) and
//     after a delay, overtaking or trailing the saga's later messages
//     (FaultDelayedDuplicate);
//   - a batch the broker confirmed reported to the relay as unconfirmed, so
//     that it publishes the rows again, as a relay that crashed between
//     publish and mark does (FaultLostConfirm);
//   - a delivery handled and committed but returned to the queue instead of
//     acknowledged, as after a crash between commit and ack (FaultLostAck);
//   - a client's database connection terminated (pg_terminate_backend)
//     while it is inside a transaction, so that a delivery, a reply or a
//     sweep rolls back wherever it was, as when the connection breaks or
//     the process dies mid-transaction (FaultKill);
//   - deliveries held back so that the messages of different sagas
//     interleave and overtake each other (FaultHold);
//   - a participant or the orchestrator closed hard mid-saga (its broker
//     connection closed, its transactions cancelled) and started again as a
//     new client, as a restarted process would be (FaultRestartParticipant,
//     FaultRestartOrchestrator);
//   - the orchestrator's clock moved forward past the step timeouts while
//     its replies are held back, so that the steps in flight time out and
//     their replies arrive late, after the re-sent command or the
//     compensation (FaultTimeout).
//
// A run is seeded: the inputs, the fault schedule and the fault draws come
// from Scenario.Seed (or the FAULTTEST_SEED environment variable), and the
// report prints it so that a failing run can be repeated. The interleaving
// of goroutines, the broker and the database is not under the seed's
// control, so a violation a seed found is found again by the same seed
// often, not always; a kit run with higher rates (or more sagas) finds it
// more reliably.
//
// After every saga has ended (or Scenario.Timeout passed) the kit checks the
// engine's own guarantees (every saga terminal; each ended as the
// Scenario's Plan says, or compensated after an injected timeout; no
// outbox row left unpublished or given up on; nothing dead-lettered) and
// then the Scenario's Invariants. The Report counts the faults injected by
// kind and gives each violation with, where one saga is at fault, its
// timeline (orchestrator.Client.History).
package faulttest

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/participant"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/transport"
)

// SeedEnv is the environment variable that sets the seed of a run whose
// Scenario.Seed is 0.
const SeedEnv = "FAULTTEST_SEED"

// Defaults of a Scenario.
const (
	// DefaultSagas is how many sagas a run starts.
	DefaultSagas = 20
	// DefaultTimeout bounds how long a run waits for its sagas to end.
	DefaultTimeout = 2 * time.Minute
	// DefaultWindow is how long the starts, the restarts and the clock
	// jumps are spread over.
	DefaultWindow = 3 * time.Second
	// DefaultMaxDelay bounds a held delivery and a delayed duplicate.
	DefaultMaxDelay = 500 * time.Millisecond
	// DefaultKillEvery is the mean time between two terminated connections
	// of DefaultFaults.
	DefaultKillEvery = 100 * time.Millisecond
	// DefaultTimeoutJump is how far the orchestrator's clock moves at each
	// FaultTimeout: past any step timeout of a typical saga.
	DefaultTimeoutJump = time.Hour
)

// Fault names a kind of fault.
type Fault string

// The kinds of fault the kit injects.
const (
	FaultDuplicate           Fault = "duplicate"
	FaultDelayedDuplicate    Fault = "delayed-duplicate"
	FaultLostConfirm         Fault = "lost-confirm"
	FaultLostAck             Fault = "lost-ack"
	FaultKill                Fault = "kill-connection"
	FaultHold                Fault = "hold"
	FaultRestartParticipant  Fault = "restart-participant"
	FaultRestartOrchestrator Fault = "restart-orchestrator"
	FaultTimeout             Fault = "timeout"
)

// allFaults lists the kinds in report order.
var allFaults = []Fault{
	FaultDuplicate, FaultDelayedDuplicate, FaultLostConfirm, FaultLostAck, FaultKill, FaultHold,
	FaultRestartParticipant, FaultRestartOrchestrator, FaultTimeout,
}

// Faults says which faults a run injects and how often. Probabilities are
// per published message (Duplicate, DelayedDuplicate), per published batch
// (LostConfirm) or per delivery or batch of deliveries handled (LostAck,
// Hold).
type Faults struct {
	// Duplicate is the probability that a published message is published
	// again at once.
	Duplicate float64
	// DelayedDuplicate is the probability that a published message is
	// published again up to MaxDelay later.
	DelayedDuplicate float64
	// LostConfirm is the probability that a confirmed batch is reported to
	// the relay as unconfirmed (it publishes it again).
	LostConfirm float64
	// LostAck is the probability that a handled delivery is returned to its
	// queue instead of acknowledged.
	LostAck float64
	// KillEvery is the mean time between two connections of the clients
	// terminated while inside a transaction (0: none). The role of
	// Scenario.Pool must be allowed to call pg_terminate_backend on them
	// (the same role, a superuser or pg_signal_backend).
	KillEvery time.Duration
	// Hold is the probability that a delivery waits up to MaxDelay before it
	// is handled.
	Hold float64
	// Restarts is how many times a client is closed hard and started
	// again, at random times: the orchestrator, then each participant (in a
	// seeded order), then round again.
	Restarts int
	// Timeouts is how many times the orchestrator's clock jumps TimeoutJump
	// forward.
	Timeouts int
	// Window is the time over which the sagas are started and the restarts
	// and clock jumps happen. Defaults to DefaultWindow (3s).
	Window time.Duration
	// MaxDelay bounds a held delivery and a delayed duplicate. Defaults to
	// DefaultMaxDelay (500ms).
	MaxDelay time.Duration
	// TimeoutRounds is how many times the clock jumps at each timeout, the
	// replies held throughout: with as many rounds as a step's
	// RetryPolicy.MaxAttempts, its saga compensates while the replies of
	// its attempts are still on their way, and they arrive after the
	// compensation. Defaults to 1.
	TimeoutRounds int
	// TimeoutJump is how far the orchestrator's clock moves at each
	// round of a timeout. Make it longer than the longest step timeout. Defaults to
	// DefaultTimeoutJump (1h).
	TimeoutJump time.Duration
}

// DefaultFaults returns the mix a Scenario with nil Faults uses: every kind,
// often enough that a run of DefaultSagas sagas sees each several times.
func DefaultFaults() Faults {
	return Faults{
		Duplicate: 0.2, DelayedDuplicate: 0.2, LostConfirm: 0.1, LostAck: 0.15, Hold: 0.2, KillEvery: DefaultKillEvery,
		Restarts: 2, Timeouts: 1,
	}
}

func (f Faults) withDefaults() Faults {
	if f.Window == 0 {
		f.Window = DefaultWindow
	}
	if f.MaxDelay == 0 {
		f.MaxDelay = DefaultMaxDelay
	}
	if f.TimeoutRounds == 0 {
		f.TimeoutRounds = 1
	}
	if f.TimeoutJump == 0 {
		f.TimeoutJump = DefaultTimeoutJump
	}
	return f
}

// Dialer connects a new broker connection; name tells which client it is
// for ("orchestrator", a participant's service, "faulttest").
type Dialer func(ctx context.Context, name string) (transport.Broker, error)

// Orchestrator is the orchestrator of a Scenario.
type Orchestrator struct {
	// Config configures it as the service does, Definitions included. The
	// kit sets Pool (a pool of its own on Scenario.Pool's database), Broker
	// and Clock, and a StopTimeout of 1ms so that a restart is abrupt; a
	// zero Relay.PollInterval becomes 100ms, a zero SweepInterval 250ms and
	// a nil Logger the Scenario's.
	Config orchestrator.Config
}

// Participant is one participant service of a Scenario.
type Participant struct {
	// Config configures it as the service does. The kit sets Pool (a pool
	// of its own on Scenario.Pool's database, so that its connections can be
	// told from the handlers' own), Broker and a StopTimeout of 1ms; a zero
	// Relay.PollInterval becomes 100ms and a nil Logger the Scenario's.
	Config participant.Config
	// Register installs the service's handlers on a new client; it is
	// called again for each restart.
	Register func(c *participant.Client)
}

// Result is how one saga of a run ended.
type Result[In any] struct {
	// Index is the input's position in the run.
	Index int
	// Input is what the saga was started for.
	Input In
	// SagaID is the saga's id.
	SagaID uuid.UUID
	// Planned is the status Scenario.Plan expects.
	Planned saga.Status
	// Status is the status it ended with (or had at the timeout).
	Status saga.Status
	// TimedOut reports a step of the saga that timed out (an injected
	// FaultTimeout): it may then end compensated although planned to
	// complete.
	TimedOut bool
}

// Invariant is a property of the service's tables that must hold once every
// saga has ended. Set Check, CheckSaga or both.
type Invariant[In any] struct {
	// Name names it in the report.
	Name string
	// Check checks the whole run.
	Check func(ctx context.Context, pool *pgxpool.Pool, results []Result[In]) error
	// CheckSaga checks one saga; the report shows the timeline of the first
	// saga for which it fails.
	CheckSaga func(ctx context.Context, pool *pgxpool.Pool, r Result[In]) error
}

// Scenario is a run: the service's clients, the sagas to start and what
// must hold once they have ended.
type Scenario[In any] struct {
	// Pool is the database of the run: the kit starts the sagas and reads
	// the tables through it, and opens each client a pool of its own with
	// its settings. Required.
	Pool *pgxpool.Pool
	// Dial connects a broker; each client, and each restart of one, gets a
	// connection of its own. Required.
	Dial Dialer
	// Orchestrator runs the sagas. Required.
	Orchestrator Orchestrator
	// Participants are the services the sagas' commands go to.
	Participants []Participant
	// Migrate applies the sagabox migrations to each client's schema
	// (both lines for the orchestrator's, messaging for the participants')
	// before Setup. Defaults to false: the service migrates in Setup.
	Migrate bool
	// Sagas is how many sagas are started. Defaults to DefaultSagas (20).
	Sagas int
	// Seed seeds the run. Defaults to the value of FAULTTEST_SEED, or a
	// random seed; the report prints it.
	Seed uint64
	// Faults are the faults injected. Defaults to DefaultFaults(); a
	// pointer to a zero Faults injects none.
	Faults *Faults
	// Timeout bounds the wait for the sagas to end. Defaults to
	// DefaultTimeout (2m).
	Timeout time.Duration
	// Input returns the input of saga i, drawn from rng. Required.
	Input func(rng *rand.Rand, i int) In
	// Setup creates and seeds the service's tables for inputs, before any
	// client starts.
	Setup func(ctx context.Context, pool *pgxpool.Pool, inputs []In) error
	// Start starts the saga of in the way the service does (its own
	// transaction, orchestrator.Start) and returns its id. Required.
	Start func(ctx context.Context, c *orchestrator.Client, in In) (uuid.UUID, error)
	// Plan returns the status the saga of in must end with when no step
	// times out. Required.
	Plan func(in In) saga.Status
	// Invariants are checked, in order, after the engine's own.
	Invariants []Invariant[In]
	// Logger receives the clients' logs (unless their Config has one) and
	// the kit's. Defaults to a logger that discards.
	Logger *slog.Logger
}

// Violation is one invariant that did not hold.
type Violation struct {
	// Invariant names it (an Invariant's Name, or one of the engine's).
	Invariant string
	// Err says how it was violated.
	Err error
	// SagaID is the saga at fault, if one is; uuid.Nil otherwise.
	SagaID uuid.UUID
	// Timeline is that saga's history.
	Timeline []saga.HistoryEntry
}

// The engine's own invariants, as Violation.Invariant names them.
const (
	InvariantTerminal    = "every saga ends"
	InvariantPlanned     = "every saga ends as planned"
	InvariantOutbox      = "no message left unpublished"
	InvariantDeadLetters = "nothing dead-lettered"
)

// Report is what a run did and found.
type Report struct {
	// Seed is the run's seed.
	Seed uint64
	// Sagas is how many sagas were started.
	Sagas int
	// Outcomes counts the sagas by the status they ended with.
	Outcomes map[saga.Status]int
	// Faults counts the faults injected, by kind.
	Faults map[Fault]int
	// TimedOut counts the sagas with a step that timed out.
	TimedOut int
	// CompensatedByTimeout counts the sagas planned to complete that
	// compensated because a step timed out.
	CompensatedByTimeout int
	// IgnoredReplies counts the sagas that ignored a reply: a duplicate, or
	// a late one (after its step was re-sent or compensated).
	IgnoredReplies int
	// Duration is how long the run took.
	Duration time.Duration
	// Violations are the invariants that did not hold, the engine's first.
	Violations []Violation
}

// Failed reports whether an invariant was violated.
func (r *Report) Failed() bool { return len(r.Violations) > 0 }

// Violated returns the first violation of the invariant named name, or nil.
func (r *Report) Violated(name string) *Violation {
	for i := range r.Violations {
		if r.Violations[i].Invariant == name {
			return &r.Violations[i]
		}
	}
	return nil
}

// FaultCount returns the number of faults injected, all kinds together.
func (r *Report) FaultCount() int {
	n := 0
	for _, v := range r.Faults {
		n += v
	}
	return n
}

// String renders the report: the counts, then the first violation with its
// saga's timeline, and how to repeat the run.
func (r *Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "faulttest: seed %d: %d sagas in %s (", r.Seed, r.Sagas, r.Duration.Round(time.Millisecond))
	first := true
	for _, st := range []saga.Status{saga.StatusCompleted, saga.StatusCompensated, saga.StatusFailed, saga.StatusRunning, saga.StatusCompensating} {
		if n := r.Outcomes[st]; n > 0 {
			if !first {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%d %s", n, st)
			first = false
		}
	}
	fmt.Fprintf(&b, "; %d with a step timed out, %d of them compensated for it; %d ignored a duplicate or late reply",
		r.TimedOut, r.CompensatedByTimeout, r.IgnoredReplies)
	b.WriteString(")\n  faults:")
	for _, f := range allFaults {
		fmt.Fprintf(&b, " %s=%d", f, r.Faults[f])
	}
	b.WriteString("\n")
	if !r.Failed() {
		b.WriteString("  invariants: OK\n")
		return b.String()
	}
	fmt.Fprintf(&b, "  %d invariant violation(s); the first:\n", len(r.Violations))
	v := r.Violations[0]
	fmt.Fprintf(&b, "  VIOLATED %q: %v\n", v.Invariant, v.Err)
	if v.SagaID != uuid.Nil {
		fmt.Fprintf(&b, "  timeline of saga %s:\n", v.SagaID)
		var t0 time.Time
		for _, h := range v.Timeline {
			if t0.IsZero() {
				t0 = h.At
			}
			step := h.Step
			if step == "" {
				step = "-"
			}
			detail := h.Detail
			if h.Attempt > 1 {
				detail = strings.TrimSpace(fmt.Sprintf("%s (attempt %d)", detail, h.Attempt))
			}
			fmt.Fprintf(&b, "    +%-9s %-18s %-22s %s\n", h.At.Sub(t0).Round(100*time.Microsecond), step, h.Event, detail)
		}
	}
	for _, o := range r.Violations[1:] {
		fmt.Fprintf(&b, "  also violated %q: %v\n", o.Invariant, o.Err)
	}
	fmt.Fprintf(&b, "  repeat with %s=%d\n", SeedEnv, r.Seed)
	return b.String()
}

// Run runs s and fails t, printing the report and its seed, when a run
// cannot be carried out or an invariant is violated; otherwise it logs the
// report. It returns the report.
func Run[In any](t testing.TB, s Scenario[In]) *Report {
	t.Helper()
	rep, err := Execute(t.Context(), s)
	if err != nil {
		if rep != nil {
			t.Fatalf("faulttest: seed %d: %v (repeat with %s=%d)", rep.Seed, err, SeedEnv, rep.Seed)
		}
		t.Fatalf("faulttest: %v", err)
	}
	if rep.Failed() {
		t.Fatal(rep.String())
	}
	t.Log(rep.String())
	return rep
}

// Seed returns the seed a Scenario with seed 0 uses: FAULTTEST_SEED's
// value, or a random one.
func Seed() (uint64, error) {
	if v := os.Getenv(SeedEnv); v != "" {
		seed, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parse %s %q: %w", SeedEnv, v, err)
		}
		return seed, nil
	}
	return rand.Uint64(), nil
}

// Execute runs s and returns its report. It returns an error, with the
// report so far when there is one, when the run cannot be carried out (a
// client fails to start, a saga cannot be started); a violated invariant is
// not an error but a Report.Violations entry.
func Execute[In any](ctx context.Context, s Scenario[In]) (*Report, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	if s.Sagas == 0 {
		s.Sagas = DefaultSagas
	}
	if s.Timeout == 0 {
		s.Timeout = DefaultTimeout
	}
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	faults := DefaultFaults()
	if s.Faults != nil {
		faults = *s.Faults
	}
	faults = faults.withDefaults()
	seed := s.Seed
	if seed == 0 {
		var err error
		if seed, err = Seed(); err != nil {
			return nil, err
		}
	}
	r := &run[In]{s: &s, faults: faults, rep: &Report{Seed: seed, Sagas: s.Sagas, Outcomes: map[saga.Status]int{}}}
	began := time.Now()
	err := r.execute(ctx, seed)
	r.rep.Duration = time.Since(began)
	if r.inj != nil {
		r.rep.Faults = r.inj.snapshot()
	}
	return r.rep, err
}

// run is one execution of a Scenario.
type run[In any] struct {
	s      *Scenario[In]
	faults Faults
	rep    *Report
	inj    *injector
	clock  atomic.Int64 // the orchestrator clock's offset, in nanoseconds
	// stalled describes the clients' connections when the outboxes did not
	// drain in time.
	stalled string

	orch    *node
	parts   []*node
	pools   []*pgxpool.Pool
	app     string // the application name prefix of the clients' connections
	orchCur atomic.Pointer[orchestrator.Client]
	reader  *orchestrator.Client
	results []Result[In]
}

// sweepInterval is the orchestrator's.
func (r *run[In]) sweepInterval() time.Duration {
	if d := r.s.Orchestrator.Config.SweepInterval; d > 0 {
		return d
	}
	return defaultSweep
}

func (r *run[In]) now() time.Time { return time.Now().Add(time.Duration(r.clock.Load())) }

func (r *run[In]) execute(ctx context.Context, seed uint64) error {
	s := r.s
	if s.Migrate {
		if err := r.migrate(ctx); err != nil {
			return err
		}
	}
	inputs := make([]In, s.Sagas)
	inputRng := rand.New(rand.NewPCG(seed, 1))
	for i := range inputs {
		inputs[i] = s.Input(inputRng, i)
	}
	if s.Setup != nil {
		if err := s.Setup(ctx, s.Pool, inputs); err != nil {
			return fmt.Errorf("faulttest: setup: %w", err)
		}
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	spare, err := s.Dial(ctx, "faulttest")
	if err != nil {
		return fmt.Errorf("faulttest: connect the broker: %w", err)
	}
	defer func() { _ = spare.Close() }()
	r.inj = newInjector(runCtx.Done(), rand.New(rand.NewPCG(seed, 2)), r.faults, spare)
	defer r.inj.quietDown()

	reader, err := orchestrator.NewClient(orchestrator.Config{
		Pool: s.Pool, Schema: s.Orchestrator.Config.Schema, Service: s.Orchestrator.Config.Service,
		Definitions: s.Orchestrator.Config.Definitions, Logger: s.Logger,
	})
	if err != nil {
		return fmt.Errorf("faulttest: %w", err)
	}
	r.reader = reader
	r.app = "faulttest-" + uuid.NewString()[:8] + "-"
	if err := r.startClients(runCtx, spare); err != nil {
		r.stopClients()
		return err
	}
	defer r.stopClients()

	// The schedule of restarts and clock jumps comes from a stream of its
	// own, so that it does not depend on how many messages were sent.
	var chaos sync.WaitGroup
	chaosCtx, stopChaos := context.WithCancel(runCtx)
	defer func() { stopChaos(); chaos.Wait() }()
	sched := r.schedule(rand.New(rand.NewPCG(seed, 3)))
	chaosErr := make(chan error, 1)
	chaos.Add(2)
	go func() {
		defer chaos.Done()
		r.killer(chaosCtx, s.Pool, r.app)
	}()
	go func() {
		defer chaos.Done()
		if err := r.chaos(chaosCtx, sched); err != nil {
			chaosErr <- err
			stop()
		}
	}()

	// The starts are spread over the window, as the restarts and clock
	// jumps are, so that each of those hits sagas in flight.
	r.results = make([]Result[In], len(inputs))
	began := time.Now()
	for i, in := range inputs {
		if wait := time.Until(began.Add(r.faults.Window * time.Duration(i) / time.Duration(len(inputs)))); wait > 0 {
			select {
			case <-runCtx.Done():
				return fmt.Errorf("faulttest: %w", runCtx.Err())
			case <-time.After(wait):
			}
		}
		id, err := s.Start(runCtx, r.orchCur.Load(), in)
		if err != nil {
			return fmt.Errorf("faulttest: start saga %d: %w", i, err)
		}
		r.results[i] = Result[In]{Index: i, Input: in, SagaID: id, Planned: s.Plan(in)}
	}
	if err := r.await(runCtx); err != nil {
		select {
		case cerr := <-chaosErr:
			return cerr
		default:
		}
		return err
	}
	stopChaos()
	chaos.Wait()
	select {
	case err := <-chaosErr:
		return err
	default:
	}
	// Stop injecting, let the delayed duplicates go out and every outbox
	// drain before the clients stop, so that the checks see the end state.
	r.inj.quietDown()
	if err := r.drain(runCtx); err != nil {
		return err
	}
	r.stopClients()
	return r.check(ctx)
}

func (r *run[In]) migrate(ctx context.Context) error {
	migrate := func(schema string, lines ...store.Line) error {
		if schema == "" {
			schema = store.DefaultSchema
		}
		st, err := store.New(r.s.Pool, schema)
		if err != nil {
			return fmt.Errorf("faulttest: %w", err)
		}
		if _, err := st.MigrateUp(ctx, lines...); err != nil {
			return fmt.Errorf("faulttest: migrate schema %s: %w", schema, err)
		}
		return nil
	}
	if err := migrate(r.s.Orchestrator.Config.Schema, store.AllLines...); err != nil {
		return err
	}
	for _, p := range r.s.Participants {
		if err := migrate(p.Config.Schema, store.LineMessaging); err != nil {
			return err
		}
	}
	return nil
}

// schemas returns the schema of every client.
func (r *run[In]) schemas() []string {
	out := []string{r.s.Orchestrator.Config.Schema}
	for _, p := range r.s.Participants {
		out = append(out, p.Config.Schema)
	}
	for i, s := range out {
		if s == "" {
			out[i] = store.DefaultSchema
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// event is one scheduled restart or clock jump.
type event struct {
	at     time.Duration
	fault  Fault
	target int // the participant restarted
}

func (r *run[In]) schedule(rng *rand.Rand) []event {
	var evs []event
	window := int64(r.faults.Window)
	// Every client is restarted once before any is restarted twice: the
	// orchestrator first, then the participants in a seeded order.
	order := append([]int{-1}, rng.Perm(len(r.parts))...)
	for i := range r.faults.Restarts {
		e := event{at: time.Duration(rng.Int64N(window)), fault: FaultRestartOrchestrator}
		if k := order[i%len(order)]; k >= 0 {
			e.fault, e.target = FaultRestartParticipant, k
		}
		evs = append(evs, e)
	}
	for range r.faults.Timeouts {
		evs = append(evs, event{at: time.Duration(rng.Int64N(window)), fault: FaultTimeout})
	}
	slices.SortStableFunc(evs, func(a, b event) int { return int(a.at - b.at) })
	return evs
}

func (r *run[In]) chaos(ctx context.Context, evs []event) error {
	begin := time.Now()
	for _, e := range evs {
		t := time.NewTimer(time.Until(begin.Add(e.at)))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		switch e.fault {
		case FaultTimeout:
			// Hold the replies, move the clock past the deadlines, let the
			// sweeper fire them, then let the late replies in.
			r.inj.closeGate()
			for range r.faults.TimeoutRounds {
				r.clock.Add(int64(r.faults.TimeoutJump))
				r.s.Logger.Info("faulttest: clock jumps", "by", r.faults.TimeoutJump)
				t := time.NewTimer(3 * r.sweepInterval())
				select {
				case <-ctx.Done():
				case <-t.C:
				}
				t.Stop()
			}
			r.inj.openGate()
		case FaultRestartOrchestrator:
			if err := r.orch.restart(); err != nil {
				return err
			}
		case FaultRestartParticipant:
			if err := r.parts[e.target].restart(); err != nil {
				return err
			}
		}
		if ctx.Err() == nil {
			r.inj.count(e.fault)
		}
	}
	return nil
}

// await waits until every saga is terminal or the timeout passes.
func (r *run[In]) await(ctx context.Context) error {
	deadline := time.Now().Add(r.s.Timeout)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		pending := 0
		for i := range r.results {
			res := &r.results[i]
			if res.Status.Terminal() {
				continue
			}
			sg, err := r.reader.Get(ctx, res.SagaID)
			if err != nil {
				if ctx.Err() != nil {
					return fmt.Errorf("faulttest: %w", ctx.Err())
				}
				continue // the database may be busy; read it again
			}
			res.Status = sg.Status
			if !res.Status.Terminal() {
				pending++
			}
		}
		if err := r.clientFailure(); err != nil {
			return err
		}
		if pending == 0 || time.Now().After(deadline) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("faulttest: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// drainTimeout bounds the wait for the outboxes to empty once the sagas
// have ended: longer than a relay's lease and its longest backoff.
const drainTimeout = time.Minute

// drain waits, a bounded time, until every outbox is empty.
func (r *run[In]) drain(ctx context.Context) error {
	deadline := time.Now().Add(drainTimeout)
	for time.Now().Before(deadline) {
		backlog := int64(0)
		for _, schema := range r.schemas() {
			_, stats, err := r.outbox(ctx, schema)
			if err != nil {
				return err
			}
			backlog += stats.Backlog
		}
		if backlog == 0 {
			return nil
		}
		if err := r.clientFailure(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("faulttest: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	// The check reports what is left, with the clients' connections as
	// they are now, before the clients stop.
	r.stalled = r.connections(ctx)
	return nil
}

// outbox returns the store of schema and its outbox's statistics.
func (r *run[In]) outbox(ctx context.Context, schema string) (*store.Store, store.OutboxStats, error) {
	st, err := store.New(r.s.Pool, schema)
	if err != nil {
		return nil, store.OutboxStats{}, fmt.Errorf("faulttest: %w", err)
	}
	stats, err := st.OutboxStats(ctx)
	if err != nil {
		return nil, store.OutboxStats{}, fmt.Errorf("faulttest: read outbox of %s: %w", schema, err)
	}
	return st, stats, nil
}

func (r *run[In]) violate(v Violation) {
	if v.SagaID != uuid.Nil && v.Timeline == nil {
		v.Timeline, _ = r.reader.History(context.WithoutCancel(context.Background()), v.SagaID)
	}
	r.rep.Violations = append(r.rep.Violations, v)
}

func (r *run[In]) check(ctx context.Context) error {
	for i := range r.results {
		res := &r.results[i]
		hist, err := r.reader.History(ctx, res.SagaID)
		if err != nil {
			return fmt.Errorf("faulttest: %w", err)
		}
		ignored := false
		for _, h := range hist {
			switch h.Event {
			case saga.HistoryTimedOut:
				res.TimedOut = true
			case saga.HistoryReplyIgnored:
				ignored = true
			}
		}
		if ignored {
			r.rep.IgnoredReplies++
		}
		if res.TimedOut && res.Status == saga.StatusCompensated && res.Planned != saga.StatusCompensated {
			r.rep.CompensatedByTimeout++
		}
		r.rep.Outcomes[res.Status]++
		if res.TimedOut {
			r.rep.TimedOut++
		}
		switch {
		case !res.Status.Terminal():
			r.violate(Violation{Invariant: InvariantTerminal, SagaID: res.SagaID, Timeline: hist,
				Err: fmt.Errorf("saga %d is still %s after %s", i, res.Status, r.s.Timeout)})
		case res.Status != res.Planned && (!res.TimedOut || res.Status != saga.StatusCompensated):
			r.violate(Violation{Invariant: InvariantPlanned, SagaID: res.SagaID, Timeline: hist,
				Err: fmt.Errorf("saga %d ended %s; its plan says %s", i, res.Status, res.Planned)})
		}
	}
	for _, schema := range r.schemas() {
		st, stats, err := r.outbox(ctx, schema)
		if err != nil {
			return err
		}
		if stats.Backlog > 0 || stats.Dead > 0 {
			rows, sagaID := r.unpublished(ctx, schema)
			r.violate(Violation{Invariant: InvariantOutbox, SagaID: sagaID,
				Err: fmt.Errorf("schema %s: %d outbox rows unpublished, %d given up on%s", schema, stats.Backlog, stats.Dead, rows)})
		}
		dead, err := st.Attempts(ctx, true, nil, 10)
		if err != nil {
			return fmt.Errorf("faulttest: read dead letters of %s: %w", schema, err)
		}
		for _, d := range dead {
			r.violate(Violation{Invariant: InvariantDeadLetters, SagaID: d.SagaID,
				Err: fmt.Errorf("schema %s: %s %s dead-lettered after %d attempts: %s", schema, d.Kind, d.Type, d.Attempts, d.LastError)})
		}
	}
	for _, inv := range r.s.Invariants {
		if inv.CheckSaga != nil {
			for _, res := range r.results {
				if err := inv.CheckSaga(ctx, r.s.Pool, res); err != nil {
					r.violate(Violation{Invariant: inv.Name, SagaID: res.SagaID,
						Err: fmt.Errorf("saga %d (%s): %w", res.Index, res.Status, err)})
					break
				}
			}
		}
		if inv.Check != nil {
			if err := inv.Check(ctx, r.s.Pool, r.results); err != nil {
				r.violate(Violation{Invariant: inv.Name, Err: err})
			}
		}
	}
	return nil
}

// unpublished describes a few of schema's unpublished outbox rows, read
// from the sagabox_outbox_v inspection view, and names the saga of the
// first.
func (r *run[In]) unpublished(ctx context.Context, schema string) (string, uuid.UUID) {
	rows, err := r.s.Pool.Query(ctx, `SELECT kind, type, coalesce(saga_id::text, ''), coalesce(step, ''), coalesce(attempt, 0),
			publish_attempts, coalesce(last_error, ''), created_at,
			coalesce(extract(epoch FROM claimed_until - now()), 0)::float8, coalesce(claimed_by, '')
		FROM `+pgx.Identifier{schema, "sagabox_outbox"}.Sanitize()+` WHERE published_at IS NULL ORDER BY id LIMIT 5`)
	if err != nil {
		return fmt.Sprintf(" (cannot list them: %v)", err), uuid.Nil
	}
	defer rows.Close()
	var b strings.Builder
	first := uuid.Nil
	for rows.Next() {
		var kind, typ, sagaID, step, lastErr, claimedBy string
		var attempt, publishAttempts int
		var created time.Time
		var leased float64
		if err := rows.Scan(&kind, &typ, &sagaID, &step, &attempt, &publishAttempts, &lastErr, &created, &leased, &claimedBy); err != nil {
			return fmt.Sprintf(" (cannot list them: %v)", err), uuid.Nil
		}
		if id, err := uuid.Parse(sagaID); err == nil && first == uuid.Nil {
			first = id
		}
		fmt.Fprintf(&b, "; %s %s of saga %s step %s attempt %d, written %s, %d publish attempts, last error %q, last claimed by %q",
			kind, typ, sagaID, step, attempt, created.Format(time.RFC3339Nano), publishAttempts, lastErr, claimedBy)
		if leased > 0 {
			fmt.Fprintf(&b, " (claimable in %.1fs)", leased)
		}
	}
	if err := rows.Err(); err != nil {
		fmt.Fprintf(&b, " (cannot list them all: %v)", err)
	}
	// The clients' connections at the stall, with the first listing only.
	b.WriteString(r.stalled)
	r.stalled = ""
	return b.String(), first
}

// connections describes the clients' database connections: each pool's
// connections in use, and the server's view of the run's sessions, so that
// a report of a stalled outbox says whether its relay waited for one.
func (r *run[In]) connections(ctx context.Context) string {
	var b strings.Builder
	b.WriteString("; pools:")
	for _, n := range append([]*node{r.orch}, r.parts...) {
		if n == nil {
			continue
		}
		st := n.pool.Stat()
		fmt.Fprintf(&b, " %s %d/%d in use (acquires waited %s in all);", n.name, st.AcquiredConns(), st.MaxConns(), st.EmptyAcquireWaitTime().Round(time.Millisecond))
	}
	rows, err := r.s.Pool.Query(ctx, `SELECT application_name, coalesce(state, ''), coalesce(wait_event, ''), count(*)
		FROM pg_stat_activity WHERE starts_with(application_name, $1)
		GROUP BY 1, 2, 3 ORDER BY 1, 2, 3`, r.app)
	if err != nil {
		return b.String()
	}
	defer rows.Close()
	b.WriteString("; sessions:")
	for rows.Next() {
		var app, state, wait string
		var count int
		if err := rows.Scan(&app, &state, &wait, &count); err != nil {
			fmt.Fprintf(&b, " (cannot read them: %v)", err)
			break
		}
		fmt.Fprintf(&b, " %s %s %s ×%d", strings.TrimPrefix(app, r.app), state, wait, count)
	}
	if err := rows.Err(); err != nil {
		fmt.Fprintf(&b, " (cannot read them all: %v)", err)
	}
	return b.String()
}
