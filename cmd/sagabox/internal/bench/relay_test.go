package bench

import (
	"context"
	"os"
	"testing"
	"time"

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
