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
and start→completed p50/p99; then the latency of each in an open-loop run at
half the engine's rate (--rate to choose it).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sagaCfg.DatabaseURL = a.databaseURL
			sagaCfg.QueueType = rabbitmq.QueueType(queueType)
			sagaCfg.Log = a.stderr
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
	f.StringVar(&sagaCfg.Only, "only", "", "run one pipeline only: engine, baseline or group (default all three)")
	f.Float64Var(&sagaCfg.Rate, "rate", 0, "sagas per second of the open-loop runs (default half the engine's saturated rate)")
	f.DurationVar(&sagaCfg.Duration, "duration", bench.DefaultDuration, "length of the open-loop runs")
	f.BoolVar(&sagaCfg.KeepSchemas, "keep-schemas", false, "leave the engine's schemas in place after the run, for inspection (drop them yourself)")
	f.StringVar(&cpuProfile, "cpuprofile", "", "write a Go CPU profile of the whole run to this file (go tool pprof)")
	cmd.AddCommand(relay, withJSON(sagas))
	return cmd
}
