package saga

import (
	"encoding/json"
	"math"
	"time"
)

// ShapeFormat is the version of Shape's JSON encoding that this package
// writes. It grows only when a change could mislead a reader of an older
// format; new node kinds and new fields do not change it (readers render an
// unknown kind as a plain step and ignore unknown fields).
const ShapeFormat = 1

// Shape describes what a definition looks like, for tools that draw or list
// it without the definition's Go code: its steps in order, its parallel
// groups, each step's kind (a command, a local step, a wait for an outside
// event), its action and compensation commands, its timeouts and retry
// policy. It holds names and settings only, never functions, and it encodes
// to JSON (the orchestrator records it in its schema, per definition name
// and version, when it starts: orchestrator.Client.Definitions reads it
// back). Its JSON keys are snake_case and its durations float seconds in
// keys ending in _seconds. Build it with Definition.Shape or ShapeOf.
//
// Readers must expect what later versions add: node kinds they do not know
// (drawn as a plain step with the kind's name) and fields they do not know
// (ignored).
type Shape struct {
	// Format is the version of the encoding: ShapeFormat when written.
	Format int `json:"format"`
	// Name is the definition's name (the saga type).
	Name string `json:"name"`
	// Version is the definition's version.
	Version int `json:"version"`
	// Nodes are the definition's steps and parallel groups, in order.
	Nodes []ShapeNode `json:"nodes"`
}

// NodeKind says what a ShapeNode is. Later versions add kinds (durable
// timers, child sagas); a reader draws a kind it does not know as a plain
// step.
type NodeKind string

// The kinds of node.
const (
	// NodeStep is a step that sends its action command to a participant
	// (Step).
	NodeStep NodeKind = "step"
	// NodeLocal is a step that runs a function in the orchestrator's own
	// transaction (LocalStep).
	NodeLocal NodeKind = "local"
	// NodeWait is a step that waits for an outside event (WaitEvent).
	NodeWait NodeKind = "wait"
	// NodeParallel is a parallel group (Parallel): its Branches run side by
	// side.
	NodeParallel NodeKind = "parallel"
)

// Known reports whether k is one of the kinds this version of the package
// writes.
func (k NodeKind) Known() bool {
	switch k {
	case NodeStep, NodeLocal, NodeWait, NodeParallel:
		return true
	}
	return false
}

// ShapeNode is one step, or one parallel group, of a Shape. Fields that do
// not apply to its kind are zero (and left out of the JSON).
type ShapeNode struct {
	// Kind says what the node is.
	Kind NodeKind `json:"kind"`
	// Name is the step's or the group's name.
	Name string `json:"name"`
	// Index is the step's index in the definition (and in
	// Instance.Steps); for a parallel group, its first branch's.
	Index int `json:"index"`
	// Action is the name of the step's action command (NodeStep).
	Action string `json:"action,omitempty"`
	// Compensation is the name of the step's compensation command; "" if it
	// has none.
	Compensation string `json:"compensation,omitempty"`
	// Event is the name of the outside event a NodeWait step waits for.
	Event string `json:"event,omitempty"`
	// Timeout is how long the orchestrator waits for each attempt of the
	// action (NodeStep) or for the event (NodeWait); 0 for none. JSON:
	// timeout_seconds.
	Timeout time.Duration `json:"-"`
	// CompensationTimeout is how long the orchestrator waits for the
	// compensation's reply before re-sending it; 0 for none. JSON:
	// compensation_timeout_seconds.
	CompensationTimeout time.Duration `json:"-"`
	// ScheduleToStartTimeout is the longest time each command of the step
	// may stay unpublished (WithScheduleToStartTimeout); 0 for none. JSON:
	// schedule_to_start_timeout_seconds.
	ScheduleToStartTimeout time.Duration `json:"-"`
	// Retry is the action's retry policy with its defaults applied
	// (NodeStep); nil for other kinds. JSON: retry, with max_attempts,
	// initial_interval_seconds, backoff_coefficient and
	// maximum_interval_seconds.
	Retry *RetryPolicy `json:"-"`
	// Conditional is true when the step has a When predicate: it may be
	// skipped.
	Conditional bool `json:"conditional,omitempty"`
	// Branches are the steps of a NodeParallel group, in declaration order.
	Branches []ShapeNode `json:"branches,omitempty"`
}

// shapeNodeJSON is a ShapeNode's JSON: its durations in float seconds.
type shapeNodeJSON struct {
	Kind                       NodeKind    `json:"kind"`
	Name                       string      `json:"name"`
	Index                      int         `json:"index"`
	Action                     string      `json:"action,omitempty"`
	Compensation               string      `json:"compensation,omitempty"`
	Event                      string      `json:"event,omitempty"`
	TimeoutSeconds             float64     `json:"timeout_seconds,omitempty"`
	CompensationTimeoutSeconds float64     `json:"compensation_timeout_seconds,omitempty"`
	ScheduleToStartSeconds     float64     `json:"schedule_to_start_timeout_seconds,omitempty"`
	Retry                      *retryJSON  `json:"retry,omitempty"`
	Conditional                bool        `json:"conditional,omitempty"`
	Branches                   []ShapeNode `json:"branches,omitempty"`
}

type retryJSON struct {
	MaxAttempts            int     `json:"max_attempts"`
	InitialIntervalSeconds float64 `json:"initial_interval_seconds"`
	BackoffCoefficient     float64 `json:"backoff_coefficient"`
	MaximumIntervalSeconds float64 `json:"maximum_interval_seconds"`
}

func seconds(d time.Duration) float64 { return d.Seconds() }

func fromSeconds(s float64) time.Duration { return time.Duration(math.Round(s * float64(time.Second))) }

// MarshalJSON encodes n with its durations in float seconds.
func (n ShapeNode) MarshalJSON() ([]byte, error) {
	j := shapeNodeJSON{
		Kind: n.Kind, Name: n.Name, Index: n.Index, Action: n.Action, Compensation: n.Compensation, Event: n.Event,
		TimeoutSeconds: seconds(n.Timeout), CompensationTimeoutSeconds: seconds(n.CompensationTimeout),
		ScheduleToStartSeconds: seconds(n.ScheduleToStartTimeout), Conditional: n.Conditional, Branches: n.Branches,
	}
	if r := n.Retry; r != nil {
		j.Retry = &retryJSON{
			MaxAttempts: r.MaxAttempts, InitialIntervalSeconds: seconds(r.InitialInterval),
			BackoffCoefficient: r.BackoffCoefficient, MaximumIntervalSeconds: seconds(r.MaximumInterval),
		}
	}
	return json.Marshal(j)
}

// UnmarshalJSON decodes what MarshalJSON encodes; unknown keys are
// ignored.
func (n *ShapeNode) UnmarshalJSON(b []byte) error {
	var j shapeNodeJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*n = ShapeNode{
		Kind: j.Kind, Name: j.Name, Index: j.Index, Action: j.Action, Compensation: j.Compensation, Event: j.Event,
		Timeout: fromSeconds(j.TimeoutSeconds), CompensationTimeout: fromSeconds(j.CompensationTimeoutSeconds),
		ScheduleToStartTimeout: fromSeconds(j.ScheduleToStartSeconds), Conditional: j.Conditional, Branches: j.Branches,
	}
	if r := j.Retry; r != nil {
		n.Retry = &RetryPolicy{
			MaxAttempts: r.MaxAttempts, InitialInterval: fromSeconds(r.InitialIntervalSeconds),
			BackoffCoefficient: r.BackoffCoefficient, MaximumInterval: fromSeconds(r.MaximumIntervalSeconds),
		}
	}
	return nil
}

// Shape describes the definition's shape (see Shape).
func (def *Definition[D]) Shape() Shape { return ShapeOf(def) }

// ShapeOf describes the shape of the definition r runs, from its Steps: a
// run of consecutive steps of one group becomes a NodeParallel node.
func ShapeOf(r Runner) Shape {
	sh := Shape{Format: ShapeFormat, Name: r.Name(), Version: r.Version(), Nodes: []ShapeNode{}}
	for i, info := range r.Steps() {
		n := nodeOf(i, info)
		if info.Group == "" {
			sh.Nodes = append(sh.Nodes, n)
			continue
		}
		last := len(sh.Nodes) - 1
		if last < 0 || sh.Nodes[last].Kind != NodeParallel || sh.Nodes[last].Name != info.Group {
			sh.Nodes = append(sh.Nodes, ShapeNode{Kind: NodeParallel, Name: info.Group, Index: i})
			last++
		}
		sh.Nodes[last].Branches = append(sh.Nodes[last].Branches, n)
	}
	return sh
}

// nodeOf describes step i.
func nodeOf(i int, info StepInfo) ShapeNode {
	n := ShapeNode{
		Kind: NodeStep, Name: info.Name, Index: i, Action: info.Action, Compensation: info.Compensation,
		Timeout: info.Timeout, CompensationTimeout: info.CompensationTimeout, ScheduleToStartTimeout: info.ScheduleToStartTimeout,
		Conditional: info.Conditional,
	}
	switch {
	case info.Local:
		n.Kind, n.Action, n.Timeout = NodeLocal, "", 0
	case info.WaitEvent != "":
		n.Kind, n.Action, n.Event = NodeWait, "", info.WaitEvent
	default:
		retry := info.Retry.WithDefaults()
		n.Retry = &retry
	}
	return n
}

// Steps returns the shape's steps in definition order: its nodes with
// each parallel group replaced by its branches, so that Steps()[i] is
// step i of the definition.
func (sh Shape) Steps() []ShapeNode {
	var out []ShapeNode
	var walk func(ns []ShapeNode)
	walk = func(ns []ShapeNode) {
		for _, n := range ns {
			if n.Kind == NodeParallel {
				walk(n.Branches)
				continue
			}
			out = append(out, n)
		}
	}
	walk(sh.Nodes)
	return out
}
