package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime/pprof"
	"time"

	"github.com/spf13/cobra"

	"github.com/sagabox/sagabox/cmd/sagabox/internal/bench"
	"github.com/sagabox/sagabox/participant"
	"github.com/sagabox/sagabox/transport"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

func (a *app) benchCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "bench", Short: "Measure sagabox on this machine"}
	cfg := bench.RelayConfig{}
	var modes []string
	relay := &cobra.Command{
		Use:   "relay",
		Short: "Relay throughput and latency as ratios of raw publish and commit rates measured in the same run",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.DatabaseURL = a.databaseURL
			cfg.Log = a.stderr
			cfg.Modes = nil
			for _, m := range modes {
				switch m := participant.RelayMode(m); m {
				case participant.RelayModePoll, participant.RelayModeLog:
					cfg.Modes = append(cfg.Modes, m)
				default:
					return withCode(ExitUsage, fmt.Errorf("--mode %q: want poll or log (or both: --mode poll,log)", m))
				}
			}
			rep, err := bench.RunRelay(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			rep.Print(a.stdout)
			return nil
		},
	}
	relay.Flags().StringVar(&cfg.AMQPURL, "amqp-url", "amqp://guest:guest@127.0.0.1:5672/", "RabbitMQ URL")
	relay.Flags().IntVar(&cfg.PublishCount, "publish", 50_000, "messages in the raw publish measurement")
	relay.Flags().IntVar(&cfg.Backlog, "backlog", 100_000, "rows in the drain measurement")
	relay.Flags().IntVar(&cfg.CommitWriters, "writers", 16, "concurrent writers in the raw commit measurement")
	relay.Flags().DurationVar(&cfg.Duration, "duration", 5*time.Second, "length of each timed measurement")
	relay.Flags().IntVar(&cfg.ProcessedRows, "old-rows", 1_000_000, "old published rows for the flat-latency measurement")
	relay.Flags().StringSliceVar(&modes, "mode", []string{"poll"}, "relay modes to measure side by side: poll, log (needs wal_level = logical), or poll,log")
	relay.Flags().Float64Var(&cfg.LatencyRate, "latency-rate", 0, "messages per second of the latency measurements (default: half the saturated rate)")
	sagaCfg := bench.SagaConfig{}
	var queueType, cpuProfile string
	sagas := &cobra.Command{
		Use:   "sagas",
		Short: "Three-step sagas end to end: sagabox's engine against a hand-written baseline and a group-commit baseline, measured in the same run",
		Long: `Runs three pipelines one after the other on the same three-step saga work, each
with fresh schemas and queues: sagabox's engine (an orchestrator and two
participant clients in this process), a hand-written baseline doing the same
work with pgx and amqp091-go directly (inbox, saga row and outbox in one round
trip per message, a SKIP LOCKED relay with pipelined confirms), and that
baseline with group-commit consumers. For each it prints the saturated rate,
the CPU time per saga of PostgreSQL, RabbitMQ and this process (from /proc),
start→completed p50/p99 and the host's CPU steal; then the latency of each in
an open-loop run at half the engine's rate, on fresh schemas and queues again.

--rates makes it a latency sweep instead: open-loop runs only, at each rate
--repeat runs of the engine and the baseline alternating (engine, baseline,
engine, …), each on fresh schemas and queues for --duration; it prints per
rate the medians over the runs of p50, p99 and CPU per saga, the engine's p50
and p99 as ratios of the baseline's, and the host's steal during each run.

--replicas measures orchestrator replicas instead: the engine saturated with
its orchestrator in 1, 2, 3… processes of its own (this binary, each with its
own pool) on one database, the participants and the starts in this process.`,
		Example: `  sagabox bench sagas
  sagabox bench sagas --rates 50,100,200 --repeat 3 --json
  sagabox bench sagas --replicas 1,2,3`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sagaCfg.DatabaseURL = a.databaseURL
			sagaCfg.QueueType = rabbitmq.QueueType(queueType)
			sagaCfg.Log = a.stderr
			if len(sagaCfg.Replicas) > 0 {
				self, err := os.Executable()
				if err != nil {
					return fmt.Errorf("find this program to start orchestrator replicas: %w", err)
				}
				sagaCfg.ReplicaCommand = []string{self, "bench", "orchestrator-replica"}
			}
			if sagaCfg.Repeat < 1 {
				return withCode(ExitUsage, fmt.Errorf("--repeat %d: want 1 or more", sagaCfg.Repeat))
			}
			if err := sagaCfg.WithDefaults().Validate(); err != nil {
				return withCode(ExitUsage, err)
			}
			if cpuProfile != "" {
				f, err := os.Create(cpuProfile)
				if err != nil {
					return fmt.Errorf("--cpuprofile: %w", err)
				}
				defer func() { _ = f.Close() }()
				if err := pprof.StartCPUProfile(f); err != nil {
					return fmt.Errorf("--cpuprofile: %w", err)
				}
				defer pprof.StopCPUProfile()
			}
			rep, err := bench.RunSagas(cmd.Context(), sagaCfg)
			if err != nil {
				return err
			}
			if a.json {
				enc := json.NewEncoder(a.stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(rep)
			}
			rep.Print(a.stdout)
			return nil
		},
	}
	f := sagas.Flags()
	f.StringVar(&sagaCfg.AMQPURL, "amqp-url", bench.DefaultAMQPURL, "RabbitMQ URL")
	f.IntVar(&sagaCfg.Sagas, "sagas", bench.DefaultSagas, "sagas of each saturated run")
	f.IntVar(&sagaCfg.Concurrency, "concurrency", bench.DefaultConcurrency, "goroutines starting sagas in the saturated runs")
	f.IntVar(&sagaCfg.PoolSize, "pool", bench.DefaultPoolSize, "connections of each pipeline's one pool (the engine's clients share theirs)")
	f.IntVar(&sagaCfg.ParticipantBatch, "participant-batch", bench.DefaultParticipantBatch, "the engine's participants' MaxBatch (group commit; 1 turns it off)")
	f.DurationVar(&sagaCfg.Linger, "linger", transport.DefaultLinger, "the engine clients' BatchLinger: how long a batch waits for more deliveries once they come faster than one at a time")
	f.IntVar(&sagaCfg.MaxRunning, "max-running", 0, "the engine orchestrator's limit of running sagas (flow control; 0: its default, -1: none)")
	f.IntVar(&sagaCfg.Workers, "workers", bench.DefaultWorkers, "deliveries of one queue handled at once (engine clients' Workers, baseline consumers per queue)")
	f.StringVar(&queueType, "queue-type", string(rabbitmq.DefaultQueueType), "queue type of every queue: quorum or classic")
	f.StringSliceVar(&sagaCfg.Only, "only", nil, "run only these pipelines: engine, baseline, group (default all three; with --rates engine,baseline)")
	f.Float64SliceVar(&sagaCfg.Rates, "rates", nil, "a latency sweep: open-loop runs only, at these rates in sagas/s (e.g. 50,100,200; default one run at half the engine's saturated rate, after the saturated runs)")
	f.IntVar(&sagaCfg.Repeat, "repeat", bench.DefaultRepeat, "open-loop runs of each pipeline at each rate, alternating, each on fresh schemas and queues (the tables show their medians)")
	f.DurationVar(&sagaCfg.Duration, "duration", bench.DefaultDuration, "length of each open-loop run")
	f.IntSliceVar(&sagaCfg.Replicas, "replicas", nil, "measure orchestrator replicas instead: the engine saturated with its orchestrator in each of these numbers of processes (e.g. 1,2,3)")
	f.BoolVar(&sagaCfg.KeepSchemas, "keep-schemas", false, "leave the engine's schemas in place after the run, for inspection (drop them yourself)")
	f.StringVar(&cpuProfile, "cpuprofile", "", "write a Go CPU profile of the whole run to this file (go tool pprof)")
	replica := &cobra.Command{
		Use:    "orchestrator-replica",
		Short:  "One orchestrator replica of `bench sagas --replicas`: reads its spec as JSON on stdin, runs until stdin ends or SIGTERM",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return bench.RunOrchestratorReplica(cmd.Context(), cmd.InOrStdin(), a.stderr)
		},
	}
	cmd.AddCommand(relay, withJSON(sagas), replica)
	return cmd
}
