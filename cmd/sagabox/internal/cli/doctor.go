package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/sagabox/sagabox/cmd/sagabox/internal/view"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/store"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

// ExitFindings means `sagabox doctor` found something to fix.
const ExitFindings = 6

// doctorWait is how long a saga's or a command's wait counts as normal for
// the doctor: the orchestrator's gauge grace (orchestrator.OverdueGrace).
const doctorWait = orchestrator.OverdueGrace

// slotLagLimit is the write-ahead log a replication slot may hold before the
// doctor reports it (the alert's threshold).
const slotLagLimit = 1 << 30

// doctor collects the checks and findings of one `sagabox doctor` run.
type doctor struct {
	out view.Doctor
}

// check records the outcome of one check.
func (d *doctor) check(name, result string) {
	d.out.Checks = append(d.out.Checks, view.DoctorCheck{Check: name, Result: result})
}

// find records a finding of check name: what is wrong and what to do.
func (d *doctor) find(f view.Finding) {
	d.out.Findings = append(d.out.Findings, f)
}

func (a *app) doctorCommand() *cobra.Command {
	var bf brokerFlags
	var slot, publication string
	cmd := &cobra.Command{
		Use:   "doctor [--amqp-url URL --namespace NS] [--queue NAME,…]",
		Short: "Check a service from outside: migrations, command routes, sagas waiting on unpublished messages, the log relay's slot, dead rows and dead letters",
		Long: `Check what can be checked of a service from outside, and print each finding with what to do:

  schema        the schema's migrations are all applied
  routes        a queue takes every command and compensation the schema's recorded saga
                definitions send (the latest version of each; an orchestrator records them
                when it starts): a command no queue takes holds its sagas for ever
  unpublished   no saga has waited past its deadline (or over a minute, without one) for a
                command still in the outbox, and no command has waited there over a minute
  relay-slot    the log relay's replication slot, if there is one, has a reader and holds
                less than 1 GiB of write-ahead log, and has its publication
  dead-rows     the outbox holds no row the relay gave up on
  dead-letters  the dead-letter queues of the --queue names are empty

The routes and dead letters need the broker (--amqp-url, --namespace). Exit 0 when there is
nothing to fix, 6 when there is a finding, 1 when a check could not run at all.

  sagabox doctor --schema orders --namespace shop --queue orders,inventory,payment
  sagabox doctor --schema inventory --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.runDoctor(cmd, &bf, store.OutboxLogNames{Slot: slot, Publication: publication})
		},
	}
	bf.register(cmd, "logical queue names whose dead-letter queues to check (repeat or comma-separate)")
	cmd.Flags().StringVar(&slot, "slot", "", "the log relay's replication slot (default sagabox_<schema>)")
	cmd.Flags().StringVar(&publication, "publication", "", "the log relay's publication (default sagabox_<schema>)")
	return withJSON(cmd)
}

func (a *app) runDoctor(cmd *cobra.Command, bf *brokerFlags, names store.OutboxLogNames) error {
	ctx := cmd.Context()
	st, pool, err := a.openStore(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	d := &doctor{out: view.Doctor{Schema: a.schema, Namespace: bf.namespace, Checks: []view.DoctorCheck{}, Findings: []view.Finding{}}}
	orchestratorSchema, migrated, err := a.doctorSchema(ctx, d, st)
	if err != nil {
		return err
	}
	if migrated {
		if orchestratorSchema {
			if err := a.doctorRoutes(ctx, d, bf, pool); err != nil {
				return err
			}
			if err := doctorUnpublishedSagas(ctx, d, st); err != nil {
				return err
			}
		}
		if err := doctorOutbox(ctx, d, st); err != nil {
			return err
		}
	}
	doctorSlot(ctx, d, st, names)
	doctorDeadLetters(ctx, d, bf)

	if err := a.print(d.out, func(w io.Writer) { printDoctor(w, &d.out) }); err != nil {
		return err
	}
	if n := len(d.out.Findings); n > 0 {
		return withCode(ExitFindings, fmt.Errorf("%d finding(s) in schema %s", n, a.schema))
	}
	return nil
}

// doctorSchema checks the schema's migrations. It reports whether the
// schema is an orchestrator's (it has the saga line) and whether its
// migrations are applied, so that the checks reading its tables can run.
func (a *app) doctorSchema(ctx context.Context, d *doctor, st *store.Store) (orchestratorSchema, migrated bool, err error) {
	states, err := st.MigrationStates(ctx)
	if err != nil {
		return false, false, err
	}
	have, latest := map[store.Line]int{}, map[store.Line]int{}
	for _, s := range states {
		latest[s.Line] = max(latest[s.Line], s.Version)
		if s.AppliedAt != nil {
			have[s.Line] = max(have[s.Line], s.Version)
		}
	}
	if have[store.LineMessaging] == 0 && have[store.LineSaga] == 0 {
		d.check("schema", "no sagabox tables")
		d.find(view.Finding{Check: "schema",
			Problem: fmt.Sprintf("schema %q has no sagabox tables", a.schema),
			Fix:     fmt.Sprintf("check --schema; to create it: `sagabox migrate up --schema %s` (an orchestrator's: both lines) or `--line messaging` (a participant's)", a.schema)})
		return false, false, nil
	}
	lines := []store.Line{store.LineMessaging}
	if have[store.LineSaga] > 0 {
		lines = append(lines, store.LineSaga)
	}
	var parts []string
	migrated = true
	for _, line := range lines {
		parts = append(parts, fmt.Sprintf("%s %d/%d", line, have[line], latest[line]))
		if have[line] < latest[line] {
			migrated = false
			d.find(view.Finding{Check: "schema",
				Problem: fmt.Sprintf("schema %q has %s migrations up to version %d of %d", a.schema, line, have[line], latest[line]),
				Fix:     fmt.Sprintf("`sagabox migrate up --schema %s --line %s`", a.schema, line)})
		}
	}
	d.check("schema", strings.Join(parts, ", "))
	return have[store.LineSaga] > 0, migrated, nil
}

// doctorRoutes checks that a queue takes each command of the latest
// version of every recorded definition.
func (a *app) doctorRoutes(ctx context.Context, d *doctor, bf *brokerFlags, pool *pgxpool.Pool) error {
	c, err := orchestrator.NewClient(orchestrator.Config{Pool: pool, Schema: a.schema, Service: "sagabox-doctor"})
	if err != nil {
		return err
	}
	defs, err := c.Definitions(ctx)
	if err != nil {
		return err
	}
	latest := map[string]orchestrator.RecordedDefinition{}
	for _, def := range defs {
		if def.Version >= latest[def.Type].Version {
			latest[def.Type] = def
		}
	}
	type use struct {
		sagaType    string
		version     int
		step, phase string
		command     string
	}
	var uses []use
	var commands []string
	for _, def := range defs {
		if latest[def.Type].Version != def.Version {
			continue
		}
		for _, n := range def.Shape.Steps() {
			for _, u := range []use{{phase: "action", command: n.Action}, {phase: "compensation", command: n.Compensation}} {
				if u.command == "" {
					continue
				}
				u.sagaType, u.version, u.step = def.Type, def.Version, n.Name
				uses = append(uses, u)
				if !slices.Contains(commands, u.command) {
					commands = append(commands, u.command)
				}
			}
		}
	}
	if len(commands) == 0 {
		d.check("routes", "no recorded definition sends a command (an orchestrator records its definitions when it starts)")
		return nil
	}
	adm, err := rabbitmq.DialAdmin(ctx, rabbitmq.Config{URL: bf.url, Namespace: bf.namespace})
	if err != nil {
		d.check("routes", "not checked: the broker is unreachable")
		d.find(view.Finding{Check: "routes", Problem: fmt.Sprintf("cannot check the commands' routes: %v", err),
			Fix: "pass the broker's --amqp-url (or AMQP_URL) and the services' --namespace"})
		return nil
	}
	defer func() { _ = adm.Close() }()
	routable, err := adm.Routable(ctx, commands)
	if err != nil {
		d.check("routes", "not checked")
		d.find(view.Finding{Check: "routes", Problem: fmt.Sprintf("cannot check the commands' routes: %v", err), Fix: "check the broker"})
		return nil
	}
	missing := 0
	for _, c := range commands {
		if !routable[c] {
			missing++
		}
	}
	d.check("routes", fmt.Sprintf("%d of %d commands of %d definitions have a queue (namespace %s)", len(commands)-missing, len(commands), len(latest), bf.namespace))
	for _, u := range uses {
		if routable[u.command] {
			continue
		}
		d.find(view.Finding{Check: "routes", SagaType: u.sagaType, Version: u.version, Step: u.step, Phase: u.phase, RoutingKey: u.command,
			Problem: fmt.Sprintf("no queue takes %s %q of saga %s v%d, step %q: each saga that reaches the step waits there", u.phase, u.command, u.sagaType, u.version, u.step),
			Fix:     "deploy the participant that handles it (it declares its queue when it subscribes), or correct the command's name (is --namespace right?); a schedule-to-start timeout on the step compensates the sagas meanwhile"})
	}
	return nil
}

// doctorUnpublishedSagas checks that no saga has waited past its deadline
// for an unpublished message.
func doctorUnpublishedSagas(ctx context.Context, d *doctor, st *store.Store) error {
	counts, err := st.UnpublishedOverdue(ctx, doctorWait)
	if err != nil {
		return err
	}
	total := int64(0)
	for _, c := range counts {
		total += c.Count
		d.find(view.Finding{Check: "unpublished", SagaType: c.Type, Count: c.Count,
			Problem: fmt.Sprintf("%d %s sagas wait past their deadline (or over %s without one) for a command or compensation still unpublished: no deadline fires meanwhile", c.Count, c.Type, doctorWait),
			Fix:     "see the routes findings and the commands waiting in the outbox; otherwise the broker or the relay is down. Sagas with a schedule-to-start timeout compensate on their own; others wait, or `sagabox saga terminate`"})
	}
	d.check("unpublished sagas", fmt.Sprintf("%d waiting past their deadline", total))
	return nil
}

// doctorOutbox checks the outbox: commands waiting long to be published,
// and rows given up on.
func doctorOutbox(ctx context.Context, d *doctor, st *store.Store) error {
	byType, err := st.OutboxUnpublishedByType(ctx, 20)
	if err != nil {
		return err
	}
	waiting := 0
	for _, b := range byType {
		age := time.Since(b.Oldest)
		if age < doctorWait {
			continue
		}
		waiting++
		f := view.Finding{Check: "unpublished", RoutingKey: b.Type, Count: b.Count,
			Problem: fmt.Sprintf("%d %s messages %q wait in the outbox, the oldest for %s, up to %d publish attempts", b.Count, b.Kind, b.Type, age.Round(time.Second), b.Attempts),
			Fix:     "the relay's last error says why; no queue bound for the type means its participant is not deployed"}
		if b.LastError != "" {
			f.Problem += "; last error: " + b.LastError
		}
		d.find(f)
	}
	d.check("unpublished commands", fmt.Sprintf("%d types waiting over %s", waiting, doctorWait))
	stats, err := st.OutboxStats(ctx)
	if err != nil {
		return err
	}
	if waiting == 0 && stats.Backlog > 0 && stats.OldestAge > doctorWait {
		d.find(view.Finding{Check: "unpublished", Count: stats.Backlog,
			Problem: fmt.Sprintf("%d messages wait in the outbox, the oldest for %s", stats.Backlog, stats.OldestAge.Round(time.Second)),
			Fix:     "the broker is unreachable or blocked, or no process runs the relay of the schema: see the relay's logs (component=relay)"})
	}
	d.check("dead-rows", fmt.Sprintf("%d", stats.Dead))
	if stats.Dead > 0 {
		d.find(view.Finding{Check: "dead-rows", Count: stats.Dead,
			Problem: fmt.Sprintf("%d outbox rows the relay gave up on (replies or events no queue takes)", stats.Dead),
			Fix:     fmt.Sprintf("`sagabox outbox dead --schema %s`, fix what they were meant for, then `sagabox outbox retry-dead`", st.Schema())})
	}
	return nil
}

// doctorSlot checks the log relay's replication slot, if there is one.
func doctorSlot(ctx context.Context, d *doctor, st *store.Store, names store.OutboxLogNames) {
	slot, pub := store.DefaultOutboxLogNames(st.Schema())
	if names.Slot != "" {
		slot = names.Slot
	}
	if names.Publication != "" {
		pub = names.Publication
	}
	ls, err := st.OutboxLogStatus(ctx, names)
	switch {
	case err != nil:
		d.check("relay-slot", "not checked")
		d.find(view.Finding{Check: "relay-slot", Problem: fmt.Sprintf("cannot read the state of replication slot %s: %v", slot, err),
			Fix: "run the doctor as a role that may read pg_replication_slots"})
	case !ls.SlotExists && !ls.PublicationExists:
		d.check("relay-slot", "none (the relay polls)")
	case !ls.SlotExists:
		d.check("relay-slot", "publication without a slot")
		d.find(view.Finding{Check: "relay-slot",
			Problem: fmt.Sprintf("publication %s exists but replication slot %s does not: a relay in log mode has nothing to read (after a failover, the promoted server has no slots)", pub, slot),
			Fix:     fmt.Sprintf("`sagabox relay setup-log --schema %s`, or `sagabox relay drop-log` if the service polls", st.Schema())})
	default:
		d.check("relay-slot", fmt.Sprintf("%s: active %t, %d bytes of write-ahead log held", slot, ls.Active, ls.LagBytes))
		if !ls.Active {
			d.find(view.Finding{Check: "relay-slot",
				Problem: fmt.Sprintf("no relay reads replication slot %s: nothing of the outbox is published in log mode, and the slot keeps write-ahead log", slot),
				Fix:     fmt.Sprintf("start the service with the relay in log mode, or drop the slot with `sagabox relay drop-log --schema %s` if it polls (a forgotten slot fills the disk)", st.Schema())})
		}
		if ls.LagBytes > slotLagLimit {
			d.find(view.Finding{Check: "relay-slot", Count: ls.LagBytes,
				Problem: fmt.Sprintf("replication slot %s holds %d bytes of write-ahead log", slot, ls.LagBytes),
				Fix:     "the relay reading it is stuck or gone: see its logs; drop a slot no relay uses"})
		}
		if !ls.PublicationExists {
			d.find(view.Finding{Check: "relay-slot", Problem: fmt.Sprintf("replication slot %s exists without its publication %s", slot, pub),
				Fix: fmt.Sprintf("`sagabox relay setup-log --schema %s`", st.Schema())})
		}
	}
}

// doctorDeadLetters checks the dead-letter queues of the --queue names.
func doctorDeadLetters(ctx context.Context, d *doctor, bf *brokerFlags) {
	if len(bf.queues) == 0 {
		d.check("dead-letters", "not checked: name the queues with --queue (AMQP cannot list them)")
		return
	}
	adm, err := rabbitmq.DialAdmin(ctx, rabbitmq.Config{URL: bf.url, Namespace: bf.namespace})
	if err != nil {
		d.check("dead-letters", "not checked: the broker is unreachable")
		d.find(view.Finding{Check: "dead-letters", Problem: fmt.Sprintf("cannot read the dead-letter queues: %v", err),
			Fix: "pass the broker's --amqp-url (or AMQP_URL) and the services' --namespace"})
		return
	}
	defer func() { _ = adm.Close() }()
	qs, err := adm.DeadLetterQueues(bf.queues)
	if err != nil {
		d.check("dead-letters", "not checked")
		d.find(view.Finding{Check: "dead-letters", Problem: fmt.Sprintf("cannot read the dead-letter queues: %v", err), Fix: "check the broker"})
		return
	}
	total := 0
	for _, q := range qs {
		switch {
		case !q.Exists:
			d.find(view.Finding{Check: "dead-letters", Queue: q.Source,
				Problem: fmt.Sprintf("queue %s does not exist in namespace %s", q.Source, bf.namespace),
				Fix:     "check --queue and --namespace: a service declares its queue when it starts"})
		case q.Messages > 0:
			total += q.Messages
			d.find(view.Finding{Check: "dead-letters", Queue: q.Source, Count: int64(q.Messages),
				Problem: fmt.Sprintf("%d messages in %s", q.Messages, q.Queue),
				Fix:     fmt.Sprintf("`sagabox dlq show --namespace %s --queue %s`, then `sagabox dlq replay` once the cause is fixed", bf.namespace, strings.TrimPrefix(q.Source, bf.namespace+"."))})
		}
	}
	d.check("dead-letters", fmt.Sprintf("%d messages in %d queues", total, len(qs)))
}

// printDoctor prints the checks, then the findings with what to do.
func printDoctor(w io.Writer, out *view.Doctor) {
	fmt.Fprintf(w, "CHECK\tRESULT\n")
	for _, c := range out.Checks {
		fmt.Fprintf(w, "%s\t%s\n", c.Check, c.Result)
	}
	if len(out.Findings) == 0 {
		fmt.Fprintf(w, "\nschema %s: nothing to fix\n", out.Schema)
		return
	}
	fmt.Fprintf(w, "\n%d FINDING(S)\n", len(out.Findings))
	for _, f := range out.Findings {
		fmt.Fprintf(w, "[%s] %s\n  fix: %s\n", f.Check, f.Problem, f.Fix)
	}
}
