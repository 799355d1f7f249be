package telemetry_test

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/sagabox/sagabox/internal/telemetry"
	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/store/driver"
)

// fakeStats answers the gauges' queries.
type fakeStats struct{ driver.Executor }

func (fakeStats) Schema() string { return "orders" }
func (fakeStats) OutboxStats(context.Context) (driver.OutboxStats, error) {
	return driver.OutboxStats{Backlog: 1, OldestAge: time.Second}, nil
}
func (fakeStats) SagaCountOverdue(context.Context, time.Time) (int64, error) { return 0, nil }
func (fakeStats) SagaCountUnpublishedOverdue(context.Context, time.Time) ([]driver.SagaCount, error) {
	return []driver.SagaCount{{Type: "checkout", Count: 2}}, nil
}
func (fakeStats) SagaCountOpen(context.Context, []string) ([]driver.SagaCount, error) {
	return nil, nil
}
func (fakeStats) OperationCountPending(context.Context) (int64, error) { return 0, nil }
func (fakeStats) SagaQueued(context.Context) ([]driver.QueuedCount, error) {
	return []driver.QueuedCount{{Type: "checkout", Count: 1, Oldest: time.Now()}}, nil
}
func (fakeStats) OutboxLogStatus(context.Context, string, string) (driver.LogStatus, error) {
	return driver.LogStatus{SlotExists: true}, nil
}

type nopPublisher struct{}

func (nopPublisher) Publish(context.Context, ...message.Message) error { return nil }

// exported returns the names sagabox's metrics have in Prometheus (through
// the OpenTelemetry exporter with its default translation), with
// histograms' _bucket, _sum and _count series, and their label names.
func exported(t *testing.T) (metrics, labels map[string]bool) {
	t.Helper()
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	require.NoError(t, err)
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	tel, err := telemetry.New(nil, mp)
	require.NoError(t, err)

	// Every instrument once.
	ctx := context.Background()
	st := fakeStats{}
	for _, register := range []func() error{
		func() error { _, err := tel.RegisterOutboxGauges(st); return err },
		func() error { _, err := tel.RegisterOverdueGauge(st, time.Minute, time.Now); return err },
		func() error { _, err := tel.RegisterSagaGauges(st, []string{"checkout"}); return err },
		func() error { _, err := tel.RegisterQueuedGauges(st, time.Now); return err },
		func() error { _, err := tel.RegisterSlotGauges(st, "sagabox_orders", "sagabox_orders"); return err },
		func() error {
			_, err := tel.RegisterUnpublishedGauge(st, []string{"checkout"}, time.Minute, time.Now)
			return err
		},
		func() error {
			_, err := tel.RegisterRouteGauge("orders", func() []telemetry.Route {
				return []telemetry.Route{{SagaType: "checkout", Command: "loyalty.award"}}
			})
			return err
		},
	} {
		require.NoError(t, register())
	}
	tel.ZeroDeliveryCounters(ctx, "participant", "orders")
	tel.ZeroSagaCounters(ctx, []string{"checkout"})
	tel.Handled(ctx, "orders", "participant", "inventory.reserve", telemetry.OutcomeApplied)
	tel.SagaFinished(ctx, "checkout", "completed", time.Second)
	tel.SagaAdmitted(ctx, "checkout", time.Second)
	tel.StepDone(ctx, "checkout", "reserve", "action", time.Second)
	tel.HandlerDone(ctx, "orders", "inventory.reserve", "command", telemetry.HandlerOK, time.Millisecond)
	require.NoError(t, tel.Publisher("orders", nopPublisher{}).Publish(ctx, command()))

	families, err := reg.Gather()
	require.NoError(t, err)
	metrics, labels = map[string]bool{}, map[string]bool{}
	var sagabox []string
	for _, f := range families {
		name := f.GetName()
		if !strings.HasPrefix(name, "sagabox_") {
			continue
		}
		sagabox = append(sagabox, name)
		metrics[name] = true
		if f.GetType() == dto.MetricType_HISTOGRAM {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				metrics[name+s] = true
			}
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = true
			}
		}
	}
	require.Len(t, sagabox, len(telemetry.MetricNames), "every metric exercised: %v", sagabox)
	return metrics, labels
}

var promName = regexp.MustCompile(`\bsagabox_[a-z0-9_]+`)

// requireKnownNames fails for a sagabox_… name in text that sagabox does
// not export as a metric or a label, and returns the metrics text uses.
func requireKnownNames(t *testing.T, where, text string, metrics, labels map[string]bool) []string {
	t.Helper()
	var used []string
	for _, name := range promName.FindAllString(text, -1) {
		switch {
		case metrics[name]:
			used = append(used, name)
		case labels[name]:
		default:
			t.Errorf("%s: %s is neither a metric nor a label sagabox exports", where, name)
		}
	}
	return used
}

// The alert rules, their tests and the Grafana dashboard use only metric
// names sagabox exports (as the OpenTelemetry Prometheus exporter names
// them), and every metric is on the dashboard.
func TestDeployArtifactsUseExportedMetricNames(t *testing.T) {
	t.Parallel()
	metrics, labels := exported(t)
	for _, path := range []string{"../../deploy/prometheus/sagabox.rules.yml", "../../deploy/prometheus/sagabox.rules.test.yml"} {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		require.NotEmpty(t, requireKnownNames(t, path, string(b), metrics, labels))
	}

	b, err := os.ReadFile("../../deploy/grafana/sagabox.json")
	require.NoError(t, err)
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(b, &dash))
	require.NotEmpty(t, dash.Panels)
	onDashboard := map[string]bool{}
	for _, p := range dash.Panels {
		require.NotEmpty(t, p.Targets, "panel %q", p.Title)
		for _, target := range p.Targets {
			used := requireKnownNames(t, "dashboard panel "+p.Title, target.Expr, metrics, labels)
			require.NotEmpty(t, used, "panel %q queries a sagabox metric", p.Title)
			for _, u := range used {
				for _, s := range []string{"_bucket", "_sum", "_count"} {
					u = strings.TrimSuffix(u, s)
				}
				onDashboard[u] = true
			}
		}
	}
	for name := range metrics {
		base := name
		for _, s := range []string{"_bucket", "_sum", "_count"} {
			if strings.HasSuffix(name, s) && metrics[strings.TrimSuffix(name, s)] {
				base = strings.TrimSuffix(name, s)
			}
		}
		require.True(t, onDashboard[base], "metric %s is on no dashboard panel", base)
	}
	require.True(t, slices.Contains(telemetry.MetricNames, telemetry.MetricHandlerDuration))
}
