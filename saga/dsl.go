package saga

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"
	"unicode"
)

// Definition is a validated saga definition with typed data D. Build it
// with New or MustNew. It is immutable and safe for concurrent use, and it
// implements Runner.
type Definition[D any] struct {
	name    string
	version int
	steps   []*StepSpec[D]
}

// StepSpec is one step of a definition, built by Step or LocalStep and
// passed to New. Its fields are set by StepOptions.
type StepSpec[D any] struct {
	name    string
	local   func(ctx context.Context, d *D) error
	isLocal bool

	// isWait marks a WaitEvent step: it waits for the outside event
	// waitEvent and applies its payload with waitApply.
	isWait    bool
	waitEvent string
	waitApply func(d *D, payload []byte) error

	action       *phaseSpec[D]
	actions      int
	compensation *phaseSpec[D]
	compensates  int

	when           func(d *D) bool
	hasWhen        bool
	timeout        time.Duration
	hasTimeout     bool
	compTimeout    time.Duration
	hasCompTimeout bool
	// startTimeout bounds how long each command of the step (action or
	// compensation) may stay unpublished (WithScheduleToStartTimeout).
	startTimeout    time.Duration
	hasStartTimeout bool
	retry           RetryPolicy
	hasRetry        bool

	// isGroup marks a parallel group built by Parallel; branches are its
	// steps. New flattens groups: the definition's steps are the branches,
	// each with group set to the group's name.
	isGroup  bool
	branches []*StepSpec[D]
	group    string
	// spanStart and spanEnd are the indices [spanStart, spanEnd) of the
	// steps in flight together with this one in a definition: its parallel
	// group, or the step alone. Set by New.
	spanStart, spanEnd int
}

// phaseSpec is a type-erased command of a step: its name, how to build its
// request from the data and, for an action, how to apply its reply.
type phaseSpec[D any] struct {
	command string
	// request encodes the request built from d; nil if no builder was given.
	request func(d *D) ([]byte, error)
	// apply decodes a success reply and applies it to d; nil for
	// compensations.
	apply func(d *D, payload []byte) error
	// check decodes a success reply without applying it (a parallel
	// branch's reply is applied when its group joins); nil for
	// compensations.
	check func(payload []byte) error
}

// StepOption configures a step. Options are created by Invoke, Compensate,
// WithTimeout, WithCompensationTimeout, WithScheduleToStartTimeout,
// WithRetry and When.
type StepOption[D any] interface {
	applyStep(s *StepSpec[D])
}

type stepOptionFunc[D any] func(s *StepSpec[D])

func (f stepOptionFunc[D]) applyStep(s *StepSpec[D]) { f(s) }

// Step declares a step that sends a command to a participant. It needs
// exactly one Invoke option; the others are optional.
func Step[D any](name string, opts ...StepOption[D]) *StepSpec[D] {
	s := &StepSpec[D]{name: name}
	for _, o := range opts {
		if o != nil {
			o.applyStep(s)
		}
	}
	return s
}

// LocalStep declares a step that runs fn in the orchestrator's process,
// inside the transaction that applies the preceding event (the orchestrator
// passes its transaction through ctx, under a savepoint of its own: see
// LocalScope). fn may modify the data. If fn returns an error wrapping
// ErrRejected (see Reject) the saga compensates, and fn's writes and data
// changes are discarded: a rejected step did nothing; any other error is
// returned by Start or Apply so that the orchestrator rolls back and
// retries. A local step may take Compensate (a command compensates it) and
// When; it cannot take Invoke, WithTimeout or WithRetry.
func LocalStep[D any](name string, fn func(ctx context.Context, d *D) error, opts ...StepOption[D]) *StepSpec[D] {
	s := Step(name, opts...)
	s.isLocal = true
	s.local = fn
	return s
}

// Invoke sets the step's action: send cmd with the request built by request
// from the saga data, and apply its success reply to the data with apply
// (nil if the reply carries nothing the saga needs). The reply is decoded
// strictly (see Command.DecodeReply).
func Invoke[D, Req, Reply any](cmd Command[Req, Reply], request func(d *D) Req, apply func(d *D, reply Reply)) StepOption[D] {
	return stepOptionFunc[D](func(s *StepSpec[D]) {
		s.actions++
		p := &phaseSpec[D]{command: cmd.Name()}
		if request != nil {
			p.request = func(d *D) ([]byte, error) { return cmd.EncodeRequest(request(d)) }
		}
		p.apply = func(d *D, payload []byte) error {
			reply, err := cmd.DecodeReply(payload)
			if err != nil {
				return err
			}
			if apply != nil {
				apply(d, reply)
			}
			return nil
		}
		p.check = func(payload []byte) error {
			_, err := cmd.DecodeReply(payload)
			return err
		}
		s.action = p
	})
}

// Compensate sets the step's compensation: send cmd with the request built
// by request from the saga data (as it is when the compensation starts). Its
// success reply payload is not decoded. A compensation cannot be rejected: a
// failure reply leaves the saga failed for an operator.
func Compensate[D, Req, Reply any](cmd Command[Req, Reply], request func(d *D) Req) StepOption[D] {
	return stepOptionFunc[D](func(s *StepSpec[D]) {
		s.compensates++
		p := &phaseSpec[D]{command: cmd.Name()}
		if request != nil {
			p.request = func(d *D) ([]byte, error) { return cmd.EncodeRequest(request(d)) }
		}
		s.compensation = p
	})
}

// WithTimeout sets how long the orchestrator waits for the reply to each
// attempt of the step's action. When it expires the command is re-sent
// (see WithRetry) or, once the attempts are exhausted, the saga compensates,
// starting with this step's own compensation. Without it the step waits
// forever (an operator can abort it).
func WithTimeout[D any](timeout time.Duration) StepOption[D] {
	return stepOptionFunc[D](func(s *StepSpec[D]) {
		s.timeout = timeout
		s.hasTimeout = true
	})
}

// WithCompensationTimeout sets how long the orchestrator waits for the reply
// to the step's compensation before re-sending it (attempt+1, no limit: a
// compensation must eventually be performed, and the participant's barrier
// performs it at most once). Without it a compensation is sent once and
// waits for its reply.
func WithCompensationTimeout[D any](timeout time.Duration) StepOption[D] {
	return stepOptionFunc[D](func(s *StepSpec[D]) {
		s.compTimeout = timeout
		s.hasCompTimeout = true
	})
}

// WithScheduleToStartTimeout sets the longest time each command of the
// step (every attempt of its action, and its compensation) may stay
// unpublished: written to the orchestrator's outbox but not yet taken by
// the broker (Temporal's schedule-to-start timeout). A step's other
// timeouts count from the moment the broker has the command, so without
// this option a command that cannot be published (no queue takes it, the
// broker or the relay is down) holds its saga for ever.
//
// When it expires for the action, the step counts as timed out at once,
// whatever attempts its retry policy has left (a re-send would wait behind
// the first): the unpublished command is withdrawn from the outbox and the
// saga compensates, starting with the step's own compensation, sent through
// the participant's barrier in case the command went out at the last
// moment. When it expires for the compensation, the compensation counts as
// failed and the saga ends failed, for an operator (a compensation is never
// given up on: it stays in the outbox and goes out when it can, and the
// operator's retry sends it again).
//
// Off by default, for a reason: a broker outage, a blocked broker or a
// stalled relay that lasts longer than timeout compensates (or fails) sagas
// that nothing was wrong with. The orchestrator does not count the time its
// own broker connection is down (see orchestrator.OutageRecoveryGrace), but
// it cannot tell a blocked broker or a backlog from a missing queue. Set it
// well above the longest outage you ride out, or leave it off and rely on
// the alert on sagas waiting for unpublished messages (docs/operations.md).
func WithScheduleToStartTimeout[D any](timeout time.Duration) StepOption[D] {
	return stepOptionFunc[D](func(s *StepSpec[D]) {
		s.startTimeout = timeout
		s.hasStartTimeout = true
	})
}

// WithRetry sets the step's retry policy (see RetryPolicy). Zero fields take
// their defaults. A policy allowing more than one attempt needs WithTimeout.
func WithRetry[D any](p RetryPolicy) StepOption[D] {
	return stepOptionFunc[D](func(s *StepSpec[D]) {
		s.retry = p
		s.hasRetry = true
	})
}

// When makes the step conditional: when the saga reaches it, pred is called
// with the data and the step is skipped if it returns false. A skipped step
// is not compensated.
func When[D any](pred func(d *D) bool) StepOption[D] {
	return stepOptionFunc[D](func(s *StepSpec[D]) {
		s.when = pred
		s.hasWhen = true
	})
}

// Parallel declares a group of steps that run side by side (fork/join): when
// the saga reaches the group it sends every branch's action at once, and it
// moves on when every branch has succeeded (or was skipped by its When).
// Each branch is a Step with its own command, compensation, timeout and
// retry policy; it cannot be a LocalStep, a WaitEvent or another group.
//
// The replies of the branches are applied to the data when the group joins,
// one after the other in the order the branches are declared here, whatever
// the order they arrived in; so the success functions see each other's
// changes in declaration order, and a branch's request and When see the data
// as it was before the group. When a branch is rejected or times out, the
// group unwinds: the replies of the branches that succeeded are applied (in
// declaration order), the branches still in flight are abandoned (their
// compensation is sent, through the participant's barrier, when they have
// one), the branches that succeeded are compensated, all at once; when every
// one of those compensations has succeeded the steps before the group are
// compensated in reverse order, as usual. A branch's compensation that fails
// leaves the saga failed once the group's other compensations have settled.
//
// The group's name names no step: it is recorded in the state of each of
// its branches (StepState.Group) and must differ from every step's name.
func Parallel[D any](name string, branches ...*StepSpec[D]) *StepSpec[D] {
	return &StepSpec[D]{name: name, isGroup: true, branches: branches}
}

// StepInfo describes a step of a definition, for tools and the
// orchestrator.
type StepInfo struct {
	// Name is the step's name.
	Name string
	// Local is true for a LocalStep.
	Local bool
	// Action is the action command's name; "" for a local step.
	Action string
	// Compensation is the compensation command's name; "" if none.
	Compensation string
	// Timeout is the action's timeout; 0 if none.
	Timeout time.Duration
	// CompensationTimeout is the compensation's re-send timeout; 0 if none.
	CompensationTimeout time.Duration
	// ScheduleToStartTimeout is the longest time each command of the step
	// may stay unpublished (WithScheduleToStartTimeout); 0 if none.
	ScheduleToStartTimeout time.Duration
	// Retry is the step's retry policy with defaults applied.
	Retry RetryPolicy
	// Conditional is true when the step has a When predicate.
	Conditional bool
	// WaitEvent is the name of the outside event a WaitEvent step waits
	// for; "" for other steps.
	WaitEvent string
	// Group is the name of the parallel group the step is a branch of; ""
	// for a step that runs alone.
	Group string
}

// New builds and validates a definition called name, at version (>= 1),
// with typed data D and the given steps in order (a Parallel group counts
// as its branches, in order: the definition's steps, their indices and
// StepInfos are the branches'). It reports every problem at once, joined,
// each wrapping ErrInvalidDefinition and naming the definition and step at
// fault.
func New[D any](name string, version int, steps ...*StepSpec[D]) (*Definition[D], error) {
	def := &Definition[D]{name: name, version: version, steps: steps}
	if err := def.validate(); err != nil {
		return nil, err
	}
	// Copy the specs so that the caller's cannot change the definition.
	def.steps = nil
	for _, s := range steps {
		members := []*StepSpec[D]{s}
		if s.isGroup {
			members = s.branches
		}
		start := len(def.steps)
		for _, b := range members {
			c := *b
			c.retry = c.retry.WithDefaults()
			if s.isGroup {
				c.group = s.name
			}
			c.spanStart, c.spanEnd = start, start+len(members)
			def.steps = append(def.steps, &c)
		}
	}
	return def, nil
}

// MustNew is like New but panics on an invalid definition. Use it for
// package-level definitions, so that a mistake stops the program at start.
func MustNew[D any](name string, version int, steps ...*StepSpec[D]) *Definition[D] {
	def, err := New(name, version, steps...)
	if err != nil {
		panic(err)
	}
	return def
}

func (def *Definition[D]) validate() error {
	var errs []error
	where := fmt.Sprintf("saga %q v%d", def.name, def.version)
	add := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s: %s", ErrInvalidDefinition, where, fmt.Sprintf(format, args...)))
	}
	if strings.TrimSpace(def.name) == "" {
		add("name is empty")
	}
	if def.version < 1 {
		add("version %d is less than 1", def.version)
	}
	if _, err := json.Marshal(new(D)); err != nil {
		add("data type %s is not JSON-serialisable: %v", reflect.TypeFor[D](), err)
	}
	if len(def.steps) == 0 {
		add("no steps")
	}
	seen := make(map[string]string, len(def.steps))
	// unique records that name is taken by who ("step 2", "parallel group
	// \"g\""); what describes it in the error if it was taken already.
	unique := func(what, who, name string) {
		if first, dup := seen[name]; dup {
			add("%s has the same name as %s", what, first)
			return
		}
		seen[name] = who
	}
	index := 0
	checkStep := func(s *StepSpec[D], group string) {
		i := index
		index++
		if s == nil {
			add("step %d is nil", i)
			return
		}
		what := fmt.Sprintf("step %q (index %d)", s.name, i)
		if group != "" {
			what = fmt.Sprintf("step %q (index %d, group %q)", s.name, i, group)
		}
		switch {
		case strings.TrimSpace(s.name) == "":
			add("step %d has an empty name", i)
		case strings.ContainsFunc(s.name, unicode.IsControl):
			add("%s: the name contains a control character", what)
		default:
			unique(what, fmt.Sprintf("step %d", i), s.name)
		}
		problems := s.problems()
		if group != "" {
			problems = append(problems, s.branchProblems()...)
		}
		for _, p := range problems {
			add("%s: %s", what, p)
		}
	}
	for _, s := range def.steps {
		if s == nil || !s.isGroup {
			checkStep(s, "")
			continue
		}
		what := fmt.Sprintf("parallel group %q", s.name)
		switch {
		case strings.TrimSpace(s.name) == "":
			add("parallel group before step index %d has an empty name", index)
		case strings.ContainsFunc(s.name, unicode.IsControl):
			add("%s: the name contains a control character", what)
		default:
			unique(what, what, s.name)
		}
		if len(s.branches) == 0 {
			add("%s has no branches", what)
		}
		for _, b := range s.branches {
			checkStep(b, s.name)
		}
	}
	return errors.Join(errs...)
}

// branchProblems returns why s cannot be a branch of a parallel group.
func (s *StepSpec[D]) branchProblems() []string {
	switch {
	case s.isGroup:
		return []string{"a parallel group cannot be a branch of another one"}
	case s.isLocal:
		return []string{"a local step cannot be a parallel branch: it runs in the orchestrator's transaction, so it has nothing to run alongside"}
	case s.isWait:
		return []string{"a wait step cannot be a parallel branch"}
	}
	return nil
}

// problems returns what is wrong with s alone.
func (s *StepSpec[D]) problems() []string {
	if s.isWait {
		p := s.waitProblems()
		if s.hasWhen && s.when == nil {
			p = append(p, "When predicate is nil")
		}
		return p
	}
	var p []string
	switch {
	case s.isLocal && s.local == nil:
		p = append(p, "local step function is nil")
	case s.isLocal && s.actions > 0:
		p = append(p, "a local step cannot also have an action (Invoke)")
	case !s.isLocal && s.actions == 0:
		p = append(p, "no action: use Invoke, or LocalStep for a local function")
	case s.actions > 1:
		p = append(p, fmt.Sprintf("%d actions (Invoke), want one", s.actions))
	}
	if s.compensates > 1 {
		p = append(p, fmt.Sprintf("%d compensations (Compensate), want at most one", s.compensates))
	}
	check := func(what string, ph *phaseSpec[D]) {
		if ph == nil {
			return
		}
		if strings.TrimSpace(ph.command) == "" {
			p = append(p, what+" command has an empty name")
		}
		if ph.request == nil {
			p = append(p, fmt.Sprintf("%s %q has no request builder", what, ph.command))
		}
	}
	if !s.isLocal {
		check("action", s.action)
	}
	check("compensation", s.compensation)
	if !s.isLocal && s.action != nil && s.compensation != nil && s.action.command == s.compensation.command && s.action.command != "" {
		p = append(p, fmt.Sprintf("action and compensation both use command %q, so their replies could not be told apart", s.action.command))
	}
	if s.hasWhen && s.when == nil {
		p = append(p, "When predicate is nil")
	}
	if s.isLocal {
		if s.hasTimeout {
			p = append(p, "a local step cannot have a timeout (WithTimeout)")
		}
		if s.hasRetry {
			p = append(p, "a local step cannot have a retry policy (WithRetry); return a plain error to have the orchestrator retry its transaction")
		}
	} else {
		if s.timeout < 0 {
			p = append(p, fmt.Sprintf("timeout %s is negative", s.timeout))
		} else if s.hasTimeout && s.timeout == 0 {
			p = append(p, "timeout is zero; omit WithTimeout for no timeout")
		}
		if err := s.retry.Validate(); err != nil {
			p = append(p, strings.Split(err.Error(), "\n")...)
		} else if n := s.retry.WithDefaults().MaxAttempts; n > 1 && s.timeout <= 0 {
			p = append(p, fmt.Sprintf("retry policy allows %d attempts but the step has no timeout, so nothing would ever trigger a retry", n))
		}
	}
	if s.hasStartTimeout {
		switch {
		case s.startTimeout <= 0:
			p = append(p, fmt.Sprintf("schedule-to-start timeout %s is not positive; omit WithScheduleToStartTimeout for none", s.startTimeout))
		case s.isLocal && s.compensation == nil:
			p = append(p, "a local step sends no command, so it cannot have a schedule-to-start timeout (WithScheduleToStartTimeout)")
		}
	}
	if s.hasCompTimeout {
		switch {
		case s.compTimeout <= 0:
			p = append(p, fmt.Sprintf("compensation timeout %s is not positive", s.compTimeout))
		case s.compensation == nil:
			p = append(p, "compensation timeout without a compensation (Compensate)")
		}
	}
	return p
}

// Name returns the definition's name, the saga type.
func (def *Definition[D]) Name() string { return def.name }

// Version returns the definition's version.
func (def *Definition[D]) Version() int { return def.version }

// String returns "name v<version>".
func (def *Definition[D]) String() string { return fmt.Sprintf("%s v%d", def.name, def.version) }

// Steps describes the definition's steps, in order.
func (def *Definition[D]) Steps() []StepInfo {
	infos := make([]StepInfo, len(def.steps))
	for i, s := range def.steps {
		info := StepInfo{
			Name:                   s.name,
			Local:                  s.isLocal,
			Timeout:                s.timeout,
			CompensationTimeout:    s.compTimeout,
			ScheduleToStartTimeout: s.startTimeout,
			Retry:                  s.retry,
			Conditional:            s.when != nil,
			WaitEvent:              s.waitEvent,
			Group:                  s.group,
		}
		if s.action != nil && !s.isLocal {
			info.Action = s.action.command
		}
		if s.compensation != nil {
			info.Compensation = s.compensation.command
		}
		infos[i] = info
	}
	return infos
}

// EncodeData encodes typed saga data as the JSON that Start takes.
func (def *Definition[D]) EncodeData(data D) (json.RawMessage, error) {
	b, err := json.Marshal(data)
	if err != nil {
		return nil, fmt.Errorf("encode data of saga %s: %w", def, err)
	}
	return b, nil
}

// DecodeData decodes an Instance's Data into the typed saga data. Unknown
// fields are tolerated, so that stored data survives a field's removal.
func (def *Definition[D]) DecodeData(data json.RawMessage) (D, error) {
	var d D
	if err := json.Unmarshal(data, &d); err != nil {
		return d, fmt.Errorf("%w: decode data of saga %s: %w", ErrInvalidPayload, def, err)
	}
	return d, nil
}
