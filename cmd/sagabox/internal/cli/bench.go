package cli

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/sagabox/sagabox/cmd/sagabox/internal/bench"
)

func (a *app) benchCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "bench", Short: "Measure sagabox on this machine"}
	cfg := bench.RelayConfig{}
	relay := &cobra.Command{
		Use:   "relay",
		Short: "Relay throughput and latency as ratios of raw publish and commit rates measured in the same run",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.DatabaseURL = a.databaseURL
			cfg.Log = a.stderr
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
	relay.Flags().Float64Var(&cfg.LatencyRate, "latency-rate", 0, "messages per second of the latency measurements (default: half the saturated rate)")
	sagaCfg := bench.SagaConfig{}
	sagas := &cobra.Command{
		Use:   "sagas",
		Short: "Three-step sagas per second end to end, as a ratio of the database's raw commit rate",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sagaCfg.DatabaseURL = a.databaseURL
			sagaCfg.Log = a.stderr
			rep, err := bench.RunSagas(cmd.Context(), sagaCfg)
			if err != nil {
				return err
			}
			rep.Print(a.stdout)
			return nil
		},
	}
	sagas.Flags().StringVar(&sagaCfg.AMQPURL, "amqp-url", "amqp://guest:guest@127.0.0.1:5672/", "RabbitMQ URL")
	sagas.Flags().IntVar(&sagaCfg.Sagas, "sagas", 2000, "sagas to run")
	sagas.Flags().IntVar(&sagaCfg.Concurrency, "concurrency", 8, "goroutines starting sagas")
	cmd.AddCommand(relay, sagas)
	return cmd
}
