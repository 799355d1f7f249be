// Package telemetrytest gives tests in-memory OpenTelemetry providers: a
// meter provider read on demand (a manual reader) and a tracer provider that
// records every span. It is the only place outside examples that imports the
// OTel SDK; the library itself uses only the API.
package telemetrytest

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// Meter is a meter provider whose metrics a test reads with Collect.
type Meter struct {
	// Provider goes into the MeterProvider field of a config.
	Provider *sdkmetric.MeterProvider
	reader   *sdkmetric.ManualReader
}

// NewMeter returns a Meter shut down when the test ends.
func NewMeter(t testing.TB) *Meter {
	t.Helper()
	r := sdkmetric.NewManualReader()
	m := &Meter{Provider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(r)), reader: r}
	t.Cleanup(func() { _ = m.Provider.Shutdown(context.Background()) })
	return m
}

// Collect reads every metric now, running the observable gauges'
// callbacks. It fails t if a callback fails.
func (m *Meter) Collect(t testing.TB) Snapshot {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := m.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatalf("telemetrytest: collect metrics: %v", err)
	}
	s := Snapshot{metrics: map[string]metricdata.Metrics{}}
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			s.metrics[mt.Name] = mt
		}
	}
	return s
}

// Snapshot is the state of every metric at one collection.
type Snapshot struct {
	metrics map[string]metricdata.Metrics
}

// Has reports whether the metric name was recorded at all.
func (s Snapshot) Has(name string) bool {
	_, ok := s.metrics[name]
	return ok
}

// Unit returns the unit of metric name.
func (s Snapshot) Unit(name string) string { return s.metrics[name].Unit }

func matches(set attribute.Set, want []attribute.KeyValue) bool {
	for _, kv := range want {
		v, ok := set.Value(kv.Key)
		if !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// Sum returns the total of the int64 counter name over the data points
// whose attributes include attrs; 0 when there are none.
func (s Snapshot) Sum(name string, attrs ...attribute.KeyValue) int64 {
	sum, _ := s.metrics[name].Data.(metricdata.Sum[int64])
	var n int64
	for _, dp := range sum.DataPoints {
		if matches(dp.Attributes, attrs) {
			n += dp.Value
		}
	}
	return n
}

// Gauge returns the value of gauge name (int64 or float64) for the data
// point whose attributes include attrs, and whether there is one.
func (s Snapshot) Gauge(name string, attrs ...attribute.KeyValue) (float64, bool) {
	switch g := s.metrics[name].Data.(type) {
	case metricdata.Gauge[int64]:
		for _, dp := range g.DataPoints {
			if matches(dp.Attributes, attrs) {
				return float64(dp.Value), true
			}
		}
	case metricdata.Gauge[float64]:
		for _, dp := range g.DataPoints {
			if matches(dp.Attributes, attrs) {
				return dp.Value, true
			}
		}
	}
	return 0, false
}

// Count returns the number of recordings of the histogram name (int64 or
// float64) over the data points whose attributes include attrs.
func (s Snapshot) Count(name string, attrs ...attribute.KeyValue) uint64 {
	var n uint64
	switch h := s.metrics[name].Data.(type) {
	case metricdata.Histogram[int64]:
		for _, dp := range h.DataPoints {
			if matches(dp.Attributes, attrs) {
				n += dp.Count
			}
		}
	case metricdata.Histogram[float64]:
		for _, dp := range h.DataPoints {
			if matches(dp.Attributes, attrs) {
				n += dp.Count
			}
		}
	}
	return n
}

// Attributes returns every attribute key used by the data points of metric
// name.
func (s Snapshot) Attributes(name string) []attribute.Key {
	seen := map[attribute.Key]bool{}
	var keys []attribute.Key
	add := func(set attribute.Set) {
		for _, kv := range set.ToSlice() {
			if !seen[kv.Key] {
				seen[kv.Key] = true
				keys = append(keys, kv.Key)
			}
		}
	}
	switch d := s.metrics[name].Data.(type) {
	case metricdata.Sum[int64]:
		for _, dp := range d.DataPoints {
			add(dp.Attributes)
		}
	case metricdata.Gauge[int64]:
		for _, dp := range d.DataPoints {
			add(dp.Attributes)
		}
	case metricdata.Gauge[float64]:
		for _, dp := range d.DataPoints {
			add(dp.Attributes)
		}
	case metricdata.Histogram[int64]:
		for _, dp := range d.DataPoints {
			add(dp.Attributes)
		}
	case metricdata.Histogram[float64]:
		for _, dp := range d.DataPoints {
			add(dp.Attributes)
		}
	}
	return keys
}

// Names returns the names of every metric recorded.
func (s Snapshot) Names() []string {
	out := make([]string, 0, len(s.metrics))
	for n := range s.metrics {
		out = append(out, n)
	}
	return out
}

// NewTracer returns a tracer provider that records every span (sampled
// always), shut down when the test ends, and its recorder.
func NewTracer(t testing.TB) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, rec
}
