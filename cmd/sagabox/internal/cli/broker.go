package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sagabox/sagabox/cmd/sagabox/internal/view"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

// brokerFlags are the flags of the commands that talk to RabbitMQ.
type brokerFlags struct {
	url, namespace string
	queues         []string
}

func (f *brokerFlags) register(cmd *cobra.Command, queuesHelp string) {
	amqpURL := os.Getenv("AMQP_URL")
	if amqpURL == "" {
		amqpURL = rabbitmq.DefaultURL
	}
	cmd.Flags().StringVar(&f.url, "amqp-url", amqpURL, "RabbitMQ URL; TLS: amqps://…?cacertfile=CA.pem[&certfile=…&keyfile=…] (env AMQP_URL)")
	cmd.Flags().StringVar(&f.namespace, "namespace", rabbitmq.DefaultNamespace, "the namespace of the exchanges and queues (rabbitmq.Config.Namespace)")
	cmd.Flags().StringSliceVar(&f.queues, "queue", nil, queuesHelp)
}

func (f *brokerFlags) dial(cmd *cobra.Command) (*rabbitmq.Admin, error) {
	if len(f.queues) == 0 {
		return nil, withCode(ExitUsage, errors.New("--queue is required: the logical queue names the services subscribe with (AMQP cannot list queues), e.g. --queue inventory,payment"))
	}
	for _, q := range f.queues {
		if strings.TrimSpace(q) == "" {
			return nil, withCode(ExitUsage, errors.New("--queue: empty queue name"))
		}
	}
	adm, err := rabbitmq.DialAdmin(cmd.Context(), rabbitmq.Config{URL: f.url, Namespace: f.namespace})
	if err != nil {
		return nil, err
	}
	return adm, nil
}

func (a *app) dlqCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "dlq", Short: "Inspect RabbitMQ dead-letter queues and replay their messages"}

	var lf brokerFlags
	list := &cobra.Command{
		Use:   "list --queue NAME[,NAME…]",
		Short: "The dead-letter queues of the named queues and how many messages each holds",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			adm, err := lf.dial(cmd)
			if err != nil {
				return err
			}
			defer func() { _ = adm.Close() }()
			qs, err := adm.DeadLetterQueues(lf.queues)
			if err != nil {
				return err
			}
			out := view.DeadLetterQueueList{Namespace: lf.namespace, Queues: []view.DeadLetterQueue{}}
			for _, q := range qs {
				if q.Exists {
					out.Queues = append(out.Queues, view.DeadLetterQueue{Queue: q.Queue, Source: q.Source, Messages: q.Messages})
				}
			}
			return a.print(out, func(w io.Writer) {
				fmt.Fprintln(w, "DEAD-LETTER QUEUE\tMESSAGES\tREPLAYS TO")
				for _, q := range out.Queues {
					fmt.Fprintf(w, "%s\t%d\t%s\n", q.Queue, q.Messages, q.Source)
				}
			})
		},
	}
	lf.register(list, "logical queue names (repeat or comma-separate)")

	var sf brokerFlags
	var limit int
	show := &cobra.Command{
		Use:   "show --queue NAME",
		Short: "The messages of a dead-letter queue, oldest first, with why each was dead-lettered (they stay in the queue)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := positive("limit", limit); err != nil {
				return err
			}
			if len(sf.queues) > 1 {
				return withCode(ExitUsage, errors.New("--queue: name one queue"))
			}
			adm, err := sf.dial(cmd)
			if err != nil {
				return err
			}
			defer func() { _ = adm.Close() }()
			msgs, err := adm.Browse(cmd.Context(), sf.queues[0], limit)
			if errors.Is(err, message.ErrNotFound) {
				return withCode(ExitNotFound, err)
			}
			if err != nil {
				return err
			}
			out := view.DeadLetterList{Queue: sf.namespace + "." + sf.queues[0] + ".dead-letter", Source: sf.namespace + "." + sf.queues[0],
				Messages: make([]view.DeadLetter, len(msgs))}
			for i, m := range msgs {
				out.Messages[i] = deadLetterView(m)
			}
			return a.print(out, func(w io.Writer) {
				fmt.Fprintln(w, "MESSAGE\tTYPE\tSAGA\tSTEP\tDEAD SINCE\tREPLAYS\tREASON")
				for _, m := range out.Messages {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", dash(m.MessageID), dash(m.Type), dash(m.SagaID), dash(m.Step),
						fmtTime(m.DeadLetteredAt), m.Replays, truncate(dash(m.Reason), 80))
				}
			})
		},
	}
	sf.register(show, "the logical queue name")
	show.Flags().IntVar(&limit, "limit", 20, "most messages to show")

	var rf brokerFlags
	var replayLimit int
	var actor, reason string
	replay := &cobra.Command{
		Use:   "replay --queue NAME --reason TEXT",
		Short: "Move dead-lettered messages back to their queue, oldest first, marked with who replayed them and why",
		Long: `Moves messages of a dead-letter queue back to the queue they came from, oldest first. Each
copy carries the headers x-sagabox-replayed-by, -replayed-at, -replayed-reason and
x-sagabox-replays (how often it was replayed), and each replay is logged to stderr. A message
leaves the dead-letter queue only once the broker confirmed its copy. The consumer's inbox makes
a replay of a message it had already applied a no-op.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := positive("limit", replayLimit); err != nil {
				return err
			}
			if strings.TrimSpace(reason) == "" {
				return withCode(ExitUsage, errors.New("--reason is required: it travels with each replayed message"))
			}
			if len(rf.queues) > 1 {
				return withCode(ExitUsage, errors.New("--queue: name one queue"))
			}
			adm, err := rf.dial(cmd)
			if err != nil {
				return err
			}
			defer func() { _ = adm.Close() }()
			log := slog.New(slog.NewTextHandler(a.stderr, nil)).With("component", "sagabox-cli")
			msgs, err := adm.Replay(cmd.Context(), rf.queues[0], replayLimit, actor, reason)
			for _, m := range msgs {
				log.Info("dead letter replayed", "queue", rf.namespace+"."+rf.queues[0], "message_id", m.MessageID, "type", m.Type,
					"saga_id", m.SagaID, "actor", actor, "reason", reason, "replays", m.Replays)
			}
			if errors.Is(err, message.ErrNotFound) {
				return withCode(ExitNotFound, err)
			}
			if err != nil {
				return fmt.Errorf("%d replayed, then: %w", len(msgs), err)
			}
			out := view.DeadLetterReplay{Queue: rf.namespace + "." + rf.queues[0] + ".dead-letter", Source: rf.namespace + "." + rf.queues[0],
				Replayed: len(msgs), Actor: actor, Reason: reason}
			return a.print(out, func(w io.Writer) {
				fmt.Fprintf(w, "%d messages replayed from %s to %s\n", out.Replayed, out.Queue, out.Source)
			})
		},
	}
	rf.register(replay, "the logical queue name")
	replay.Flags().IntVar(&replayLimit, "limit", 100, "most messages to replay")
	replay.Flags().StringVar(&reason, "reason", "", "why (sent with each message and logged; required)")
	replay.Flags().StringVar(&actor, "actor", defaultActor(), "who (sent with each message and logged)")
	cmd.AddCommand(withJSON(list), withJSON(show), withJSON(replay))
	return cmd
}

func deadLetterView(m rabbitmq.DeadLetter) view.DeadLetter {
	v := view.DeadLetter{MessageID: m.MessageID, Type: m.Type, Kind: m.Kind, SagaID: m.SagaID, Step: m.Step, Reason: m.Reason,
		Replays: m.Replays, Bytes: len(m.Body)}
	if !m.At.IsZero() {
		v.DeadLetteredAt = m.At.UTC()
	}
	if json.Valid(m.Body) {
		v.Payload = m.Body
	}
	return v
}

func (a *app) namespaceCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "namespace", Short: "Manage a RabbitMQ namespace's exchanges and queues"}
	var f brokerFlags
	var yes bool
	teardown := &cobra.Command{
		Use:   "teardown --namespace NS --queue NAME[,NAME…] [--yes]",
		Short: "Delete a namespace's exchanges and the named queues with their dead-letter and retry queues (a dry run without --yes)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			adm, err := f.dial(cmd)
			if err != nil {
				return err
			}
			defer func() { _ = adm.Close() }()
			top, err := adm.Teardown(f.queues, !yes)
			if err != nil {
				return err
			}
			out := view.Teardown{Namespace: f.namespace, DryRun: !yes, Queues: top.Queues, Exchanges: top.Exchanges}
			if out.Queues == nil {
				out.Queues = []string{}
			}
			if out.Exchanges == nil {
				out.Exchanges = []string{}
			}
			return a.print(out, func(w io.Writer) {
				verb := "would delete (dry run; --yes deletes)"
				if yes {
					verb = "deleted"
				}
				for _, q := range out.Queues {
					fmt.Fprintf(w, "%s queue %s\n", verb, q)
				}
				for _, x := range out.Exchanges {
					fmt.Fprintf(w, "%s exchange %s\n", verb, x)
				}
				if len(out.Queues)+len(out.Exchanges) == 0 {
					fmt.Fprintf(w, "namespace %s: nothing to delete\n", f.namespace)
				}
			})
		},
	}
	f.register(teardown, "logical queue names whose queues to delete (repeat or comma-separate)")
	teardown.Flags().BoolVar(&yes, "yes", false, "delete for real (default: print what would be deleted)")
	cmd.AddCommand(withJSON(teardown))
	return cmd
}
