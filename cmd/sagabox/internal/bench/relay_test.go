package bench

import (
	"context"
	"os"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
)

// BenchmarkRelay runs the relay measurements once and prints them as ratios
// of the raw ceilings measured in the same run:
//
//	go test -run '^$' -bench BenchmarkRelay -benchtime 1x ./internal/bench
func BenchmarkRelay(b *testing.B) {
	dbtest.Pool(b) // creates the test database if needed
	for range b.N {
		rep, err := RunRelay(context.Background(), RelayConfig{
			DatabaseURL: dbtest.URL(), AMQPURL: amqptest.URL(b),
			PublishCount: 50_000, Backlog: 100_000, CommitWriters: 16,
			Duration: 5 * time.Second, ProcessedRows: 1_000_000, Log: os.Stderr,
		})
		if err != nil {
			b.Fatal(err)
		}
		rep.Print(os.Stderr)
		b.ReportMetric(rep.DrainPerSec/rep.RawPublishPerSec, "drain/raw-publish")
		b.ReportMetric(float64(rep.Latency.P50.Microseconds()), "p50-µs")
		b.ReportMetric(float64(rep.Latency.P99.Microseconds()), "p99-µs")
	}
}

// TestRelayBenchSmoke runs the relay bench on small numbers against the
// real services and checks the report's structure, never a timing, and
// that the run leaves no queue behind.
func TestRelayBenchSmoke(t *testing.T) {
	t.Parallel()
	dbtest.Pool(t) // creates the test database if needed
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url := amqptest.URL(t)
	rep, err := RunRelay(ctx, RelayConfig{
		DatabaseURL: dbtest.URL(), AMQPURL: url,
		PublishCount: 1_000, Backlog: 2_000, CommitWriters: 2,
		Duration: 300 * time.Millisecond, ProcessedRows: 2_000,
	})
	require.NoError(t, err)
	for name, v := range map[string]float64{"raw publish": rep.RawPublishPerSec, "raw commits": rep.RawCommitPerSec, "drain": rep.DrainPerSec, "latency rate": rep.LatencyRatePerSec} {
		require.Positive(t, v, name)
	}
	for name, p := range map[string]Percentiles{"raw hop": rep.RawHop, "latency": rep.Latency, "latency with old rows": rep.LatencyOldRows} {
		require.Positive(t, p.N, name)
		require.LessOrEqual(t, p.P50, p.P99, name)
	}
	require.Len(t, rep.Modes, 1)

	conn, err := amqp.Dial(url)
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclarePassive(rep.namespace+".sink", true, false, false, false, nil)
	var amqpErr *amqp.Error
	require.ErrorAs(t, err, &amqpErr, "the sink queue is gone")
	require.Equal(t, amqp.NotFound, amqpErr.Code)
}
