package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/sagabox/sagabox/internal/telemetry"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store/driver"
)

// StartOpts tunes one Start. A nil *StartOpts uses defaults.
type StartOpts struct {
	// StartKey makes the start idempotent: when a saga of the same
	// definition name was already started with this key, Start starts
	// nothing (no row, no message, no local step) and returns that saga
	// with Existing set, or an error, as StartKeyPolicy says. Defaults to ""
	// (no key).
	StartKey string

	// ConcurrencyKey makes the saga one of a kind (the "semantic lock" of
	// MassTransit and NServiceBus users): at most one saga of the same
	// definition name and key runs or compensates at a time. A start while
	// another is queued, running or compensating is queued behind it, and
	// admitted, in start order, once it has ended (completed, compensated or
	// failed). Defaults to "" (no key). Start holds the key's lock, an
	// advisory lock, until tx ends, which orders concurrent starts of one
	// key; use a READ COMMITTED tx (PostgreSQL's default) so that Start sees
	// what the key's previous holder committed.
	ConcurrencyKey string

	// StartKeyPolicy says what a start does whose StartKey names a saga
	// already. Defaults to StartKeyRejectDifferent: the same data returns
	// that saga, different data is an error wrapping ErrStartKeyConflict.
	StartKeyPolicy StartKeyPolicy
}

// Started is the outcome of Start.
type Started struct {
	// ID is the saga's id, a UUIDv7.
	ID uuid.UUID
	// Status is the saga's status after Start: running; queued when flow
	// control keeps it waiting (Config.Admission, StartOpts.ConcurrencyKey);
	// or already completed or compensated if it had only local or skipped
	// steps.
	Status saga.Status
	// Existing is true when StartOpts.StartKey named a saga started before;
	// ID and Status are then that saga's.
	Existing bool
}

type txKey struct{}

// TxFromContext returns the transaction in which the orchestrator runs a
// definition's local steps (saga.LocalStep): a savepoint of the caller's
// transaction during Start, of the transaction that applies a reply, timer
// or operator action otherwise. The savepoint is rolled back if the step
// rejects or fails, and released into the enclosing transaction otherwise.
// Do the step's writes in it and never commit or roll it back. It returns
// nil outside of a local step.
func TxFromContext(ctx context.Context) pgx.Tx {
	tx, _ := ctx.Value(txKey{}).(pgx.Tx)
	return tx
}

// withTx returns ctx carrying tx for the saga core's local steps, each of
// which runs under a savepoint of tx.
func withTx(ctx context.Context, tx pgx.Tx) context.Context {
	return saga.WithLocalScope(ctx, func(ctx context.Context, run func(ctx context.Context) error) error {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return fmt.Errorf("savepoint: %w", err)
		}
		return runSavepoint(ctx, sp, run)
	})
}

// localScope returns ctx carrying t, one of the Client's own transactions,
// for the saga core's local steps, each of which runs under a savepoint of
// t.
func (c *Client) localScope(ctx context.Context, t driver.Tx) context.Context {
	return saga.WithLocalScope(ctx, func(ctx context.Context, run func(ctx context.Context) error) error {
		sp, err := t.Savepoint(ctx)
		if err != nil {
			return fmt.Errorf("savepoint: %w", err)
		}
		return runSavepoint(ctx, sp, run)
	})
}

// runSavepoint runs one local step in sp: its writes are rolled back if it
// rejects or fails, and released into the enclosing transaction otherwise.
func runSavepoint(ctx context.Context, sp pgx.Tx, run func(ctx context.Context) error) error {
	if err := run(context.WithValue(ctx, txKey{}, sp)); err != nil {
		if rerr := sp.Rollback(ctx); rerr != nil {
			return fmt.Errorf("roll back to savepoint after %w: %w", err, rerr)
		}
		return err
	}
	if err := sp.Commit(ctx); err != nil {
		return fmt.Errorf("release savepoint: %w", err)
	}
	return nil
}

// Start starts a saga of def with data in tx, the caller's transaction: the
// saga row, its history and its first command are written in tx, so the
// saga exists, and its command is sent, if and only if tx commits. def must
// be registered with c. Leading local steps run in tx (see TxFromContext).
// Start does not commit tx.
//
// The relay cannot see tx's commit: it is woken a few times in the
// following half second and polls every Relay.PollInterval; call c.Wake
// after committing for the lowest latency.
func Start[D any](ctx context.Context, c *Client, tx pgx.Tx, def *saga.Definition[D], data D, opts *StartOpts) (*Started, error) {
	if def == nil {
		return nil, errors.New("orchestrator: start: definition is nil")
	}
	raw, err := def.EncodeData(data)
	if err != nil {
		return nil, fmt.Errorf("orchestrator: start %s: %w", def, err)
	}
	return c.StartJSON(ctx, tx, def.Name(), def.Version(), raw, opts)
}

// StartJSON is Start for a definition known by name and version, with its
// data as JSON (e.g. from a CLI or another language). Version 0 means the
// highest registered version of name.
//
// Start runs in a span "start saga <name>", a child of ctx's span: the
// saga's first commands carry it, so the whole saga is one trace under it.
func (c *Client) StartJSON(ctx context.Context, tx pgx.Tx, name string, version int, data json.RawMessage, opts *StartOpts) (*Started, error) {
	ctx, span := c.tel.Tracer().Start(ctx, "start saga "+name, trace.WithAttributes(telemetry.AttrSagaType.String(name)))
	defer span.End()
	st, err := c.startJSON(ctx, tx, name, version, data, opts)
	if err != nil {
		telemetry.Fail(span, err)
		return nil, err
	}
	span.SetAttributes(telemetry.AttrSagaID.String(st.ID.String()), telemetry.AttrStatus.String(string(st.Status)),
		attribute.Bool("sagabox.saga.existing", st.Existing))
	return st, nil
}

func (c *Client) startJSON(ctx context.Context, tx pgx.Tx, name string, version int, data json.RawMessage, opts *StartOpts) (*Started, error) {
	if tx == nil {
		return nil, fmt.Errorf("orchestrator: start %s: transaction is nil", name)
	}
	if opts == nil {
		opts = &StartOpts{}
	}
	p, err := c.planStart(name, version, data, opts)
	if err != nil {
		return nil, err
	}
	trace.SpanFromContext(ctx).SetAttributes(telemetry.AttrSagaVersion.Int(p.runner.Version()))
	started, err := c.writeStart(ctx, tx, p, data, opts)
	if err != nil {
		return nil, fmt.Errorf("orchestrator: start %s v%d: %w", p.runner.Name(), p.runner.Version(), err)
	}
	return started, nil
}

// startPlan is what a start decided before it writes: the definition, the
// saga's id, the hash of its data (with a start key) and whether its
// writes run under a savepoint.
type startPlan struct {
	runner saga.Runner
	id     uuid.UUID
	hash   []byte
	// local: the definition has local steps; reuse: the start key of a
	// finished saga is released for this start. Both write before the
	// start statement, under a savepoint that a start that does not happen
	// rolls back.
	local, reuse bool
}

// planStart finds the definition name (its latest version when version is
// 0) and checks opts, and returns the start's plan.
func (c *Client) planStart(name string, version int, data json.RawMessage, opts *StartOpts) (startPlan, error) {
	var p startPlan
	var err error
	if version == 0 {
		p.runner, err = c.registry.Latest(name)
	} else {
		p.runner, err = c.registry.Lookup(name, version)
	}
	if err != nil {
		return p, fmt.Errorf("orchestrator: start: %w (register it with the Client)", err)
	}
	fail := func(format string, args ...any) (startPlan, error) {
		return p, fmt.Errorf("orchestrator: start %s v%d: "+format, append([]any{p.runner.Name(), p.runner.Version()}, args...)...)
	}
	switch {
	case opts.StartKeyPolicy < StartKeyRejectDifferent || opts.StartKeyPolicy > StartKeyReuseFinished:
		return fail("StartOpts.StartKeyPolicy %s is unknown", opts.StartKeyPolicy)
	case opts.StartKey != "" && strings.TrimSpace(opts.StartKey) == "":
		return fail("StartOpts.StartKey is blank")
	case opts.ConcurrencyKey != "" && strings.TrimSpace(opts.ConcurrencyKey) == "":
		return fail("StartOpts.ConcurrencyKey is blank")
	}
	if p.id, err = uuid.NewV7(); err != nil {
		return fail("generate saga id: %w", err)
	}
	if opts.StartKey != "" {
		if p.hash, err = startDataHash(data); err != nil {
			return fail("%w", err)
		}
	}
	p.local = hasLocalStep(p.runner)
	p.reuse = opts.StartKey != "" && opts.StartKeyPolicy == StartKeyReuseFinished
	return p, nil
}

// writeStart writes the saga of plan p in tx: started, or queued (flow
// control), or, when its start key is taken, nothing (the existing saga
// answers, as StartKeyPolicy says).
func (c *Client) writeStart(ctx context.Context, tx pgx.Tx, p startPlan, data json.RawMessage, opts *StartOpts) (*Started, error) {
	work := tx
	if p.local || p.reuse {
		var err error
		if work, err = tx.Begin(ctx); err != nil {
			return nil, fmt.Errorf("savepoint: %w", err)
		}
		defer work.Rollback(context.WithoutCancel(ctx))
	}
	if existing, err := c.takeStartKey(ctx, work, p, opts); existing != nil || err != nil {
		return existing, err
	}
	// Flow control: past the definition's limit, or with its concurrency
	// key held, the saga is written as queued instead of started.
	why, err := c.mustQueue(ctx, work, p.runner.Name(), opts.ConcurrencyKey)
	if err != nil {
		return nil, err
	}
	var res saga.Result
	var inserted bool
	if why != "" {
		inserted, err = c.enqueue(ctx, work, p.runner, p.id, data, opts, p.hash, why)
	} else {
		res, inserted, err = c.start(ctx, work, p.runner, p.id, data, opts, p.hash)
	}
	if err != nil {
		return nil, err
	}
	if !inserted {
		// A concurrent start took the key. The deferred rollback undoes the
		// local steps' writes (and a key release).
		existing, err := c.db.SagaGetByStartKey(ctx, tx, p.runner.Name(), opts.StartKey)
		if err != nil {
			return nil, err
		}
		return c.existingStart(p.runner, &existing, opts.StartKeyPolicy, p.hash)
	}
	if work != tx {
		if err := work.Commit(ctx); err != nil {
			return nil, fmt.Errorf("release savepoint: %w", err)
		}
	}
	return c.startWritten(ctx, p, res, why), nil
}

// takeStartKey releases, under StartKeyReuseFinished, the start key of the
// finished saga holding it to the saga of p, and, for a definition with
// local steps (which write before the start statement, which writes nothing
// when the key is taken), looks the key up first: a saga holding it answers
// the start (existingStart).
func (c *Client) takeStartKey(ctx context.Context, work pgx.Tx, p startPlan, opts *StartOpts) (*Started, error) {
	if p.reuse {
		if err := c.releaseStartKey(ctx, work, p.runner.Name(), opts.StartKey, p.id); err != nil {
			return nil, err
		}
	}
	if opts.StartKey == "" || !p.local {
		return nil, nil
	}
	existing, err := c.db.SagaGetByStartKey(ctx, work, p.runner.Name(), opts.StartKey)
	switch {
	case err == nil:
		return c.existingStart(p.runner, &existing, opts.StartKeyPolicy, p.hash)
	case errors.Is(err, message.ErrNotFound):
		return nil, nil
	}
	return nil, err
}

// startWritten counts and logs a saga written by a start (queued for why,
// when not empty), notes its deadline, wakes the relay's follow-up
// wake-ups, and returns what the start returns.
func (c *Client) startWritten(ctx context.Context, p startPlan, res saga.Result, why string) *Started {
	name := p.runner.Name()
	c.tel.SagaStarted(ctx, name)
	if why != "" {
		c.signalStart(true)
		c.log.Debug("saga queued", "saga_id", p.id.String(), "saga_type", name, "version", p.runner.Version(), "reason", why)
		return &Started{ID: p.id, Status: saga.StatusQueued}
	}
	c.tel.SagaAdmitted(ctx, name, 0)
	if res.Instance.Status.Terminal() {
		c.tel.SagaFinished(ctx, name, string(res.Instance.Status), 0)
	}
	if !res.Instance.Deadline.IsZero() {
		c.noteDeadline(res.Instance.Deadline)
	}
	c.signalStart(false)
	c.log.Debug("saga started", "saga_id", p.id.String(), "saga_type", name, "version", p.runner.Version(), "status", string(res.Instance.Status))
	return &Started{ID: p.id, Status: res.Instance.Status}
}

// start runs the saga core's Start and writes the saga, its history and its
// first messages in tx in one statement. It reports false when the start key
// is taken: nothing was written.
func (c *Client) start(ctx context.Context, tx pgx.Tx, runner saga.Runner, id uuid.UUID, data json.RawMessage, opts *StartOpts, startHash []byte) (saga.Result, bool, error) {
	now := c.now()
	res, err := runner.Start(withTx(ctx, tx), id, data, now)
	if err != nil {
		return saga.Result{}, false, err
	}
	rec := driver.SagaRecord{StartKey: opts.StartKey, ConcurrencyKey: opts.ConcurrencyKey, StartDataHash: startHash}
	rec.TraceParent, rec.TraceState = telemetry.Inject(ctx)
	if err := applyToRecord(&rec, &res.Instance, now); err != nil {
		return saga.Result{}, false, err
	}
	st := &driver.SagaStart{
		Saga: rec, History: historyRecords(id, res.History), Messages: c.messages(ctx, &res.Instance, res.Emit),
	}
	inserted, err := c.db.SagaStart(ctx, tx, st, now)
	if err != nil || !inserted {
		return res, false, err
	}
	// Kept before the caller commits: its first reply can only follow the
	// commit, and an entry for a saga whose start rolled back is never
	// asked for (its id is new).
	c.cache.put(&st.Saga)
	if c.cfg.Relay.Notify {
		if err := c.db.OutboxNotify(ctx, tx); err != nil {
			return res, false, err
		}
	}
	return res, true, nil
}

// hasLocalStep reports whether runner has a local step.
func hasLocalStep(runner saga.Runner) bool {
	for _, st := range runner.Steps() {
		if st.Local {
			return true
		}
	}
	return false
}
