package orchestrator

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/sagabox/sagabox/internal/telemetry"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/transport"
)

// DefaultRouteCheckInterval is Config.RouteCheckInterval's default.
const DefaultRouteCheckInterval = time.Minute

// commandUse is a place where a registered definition sends a command:
// the saga type and version, the step and the phase.
type commandUse struct {
	sagaType string
	version  int
	step     string
	phase    saga.Phase
	command  string
}

// commandUses lists where the registered definitions send commands, in
// definition and step order.
func (c *Client) commandUses() []commandUse {
	var out []commandUse
	for _, r := range c.registry.Runners() {
		for _, st := range r.Steps() {
			if st.Action != "" {
				out = append(out, commandUse{sagaType: r.Name(), version: r.Version(), step: st.Name, phase: saga.PhaseAction, command: st.Action})
			}
			if st.Compensation != "" {
				out = append(out, commandUse{sagaType: r.Name(), version: r.Version(), step: st.Name, phase: saga.PhaseCompensation, command: st.Compensation})
			}
		}
	}
	return out
}

// routeState is what the Client last learnt of its commands' routes: by
// command, whether a queue takes it. It feeds sagabox.commands.unroutable.
type routeState struct {
	mu       sync.Mutex
	routable map[string]bool
}

// set records the routes checked.
func (s *routeState) set(routable map[string]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.routable == nil {
		s.routable = map[string]bool{}
	}
	for k, v := range routable {
		s.routable[k] = v
	}
}

// get returns what was learnt of command's route, and whether anything
// was.
func (s *routeState) get(command string) (routable, known bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	routable, known = s.routable[command]
	return routable, known
}

// gaugeRoutes returns the routes of the gauge: every command of every saga
// type checked so far, once.
func (c *Client) gaugeRoutes() []telemetry.Route {
	var out []telemetry.Route
	for _, u := range c.commandUses() {
		routable, known := c.routes.get(u.command)
		r := telemetry.Route{SagaType: u.sagaType, Command: u.command, Routable: routable}
		if known && !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	return out
}

// routeLoop checks, when Run starts, that a queue takes each command and
// compensation of the registered definitions (the broker's
// transport.RouteChecker), and logs each one no queue takes, with its saga
// type, step and what to do: until a queue takes it, its sagas wait at that
// step, and with the admission limit every saga of the definition may
// stall. It checks those again every RouteCheckInterval until a queue takes
// them all. A broker that cannot check routes is not checked.
func (c *Client) routeLoop(ctx, _ context.Context) {
	rc, ok := c.cfg.Broker.(transport.RouteChecker)
	if !ok {
		c.log.Debug("the broker cannot check routes; commands no queue takes are not reported at start")
		return
	}
	uses := c.commandUses()
	var pending []string
	for _, u := range uses {
		if !slices.Contains(pending, u.command) {
			pending = append(pending, u.command)
		}
	}
	failures := 0
	for len(pending) > 0 {
		got, err := rc.Routable(ctx, pending)
		wait := c.cfg.RouteCheckInterval
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			failures++
			c.log.Warn("checking the routes of the definitions' commands failed; will try again", "err", err, "failures", failures)
			wait = min(wait, 10*time.Second)
			if wait <= 0 {
				wait = 10 * time.Second
			}
		default:
			failures = 0
			pending = c.reportRoutes(ctx, uses, got)
			if c.cfg.RouteCheckInterval < 0 {
				return
			}
		}
		if len(pending) == 0 {
			return
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// reportRoutes records the routes got, logs the commands no queue takes
// (each use, the first time) and those a queue now takes, and returns the
// commands no queue takes.
func (c *Client) reportRoutes(ctx context.Context, uses []commandUse, got map[string]bool) []string {
	var unroutable []string
	for _, u := range uses {
		routable, checked := got[u.command]
		if !checked {
			continue
		}
		was, known := c.routes.get(u.command)
		switch {
		case !routable && !known:
			c.log.WarnContext(ctx, "no queue takes a command of a saga definition: each saga that reaches the step waits there (its deadline starts only once the command is published), and with the admission limit every saga of the definition may stall. Deploy the participant that handles the command (it declares its queue when it subscribes) or correct the command's name; a schedule-to-start timeout on the step (saga.WithScheduleToStartTimeout) compensates the sagas meanwhile; `sagabox doctor` checks again",
				"saga_type", u.sagaType, "version", u.version, "step", u.step, "phase", string(u.phase), "routing_key", u.command,
				"exchange", transport.ExchangeCommands)
		case routable && known && !was:
			c.log.InfoContext(ctx, "a queue now takes a command that had none", "saga_type", u.sagaType, "step", u.step,
				"phase", string(u.phase), "routing_key", u.command)
		}
		if !routable && !slices.Contains(unroutable, u.command) {
			unroutable = append(unroutable, u.command)
		}
	}
	c.routes.set(got)
	return unroutable
}
