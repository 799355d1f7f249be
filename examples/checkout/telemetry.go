package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// observability holds the example's OpenTelemetry providers: a Prometheus
// endpoint for metrics (-metrics-addr) and an in-memory span recorder whose
// spans of one saga are printed at the end (-trace).
type observability struct {
	tracerProvider trace.TracerProvider
	meterProvider  metric.MeterProvider
	recorder       *tracetest.SpanRecorder
	shutdown       []func(context.Context) error
}

func newObservability(o *options, out io.Writer) (*observability, error) {
	obs := &observability{tracerProvider: tracenoop.NewTracerProvider(), meterProvider: noop.NewMeterProvider()}
	if o.trace {
		obs.recorder = tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(obs.recorder))
		obs.tracerProvider = tp
		obs.shutdown = append(obs.shutdown, tp.Shutdown)
	}
	if o.metricsAddr != "" {
		exporter, err := otelprom.New()
		if err != nil {
			return nil, fmt.Errorf("prometheus exporter: %w", err)
		}
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
		obs.meterProvider = mp
		obs.shutdown = append(obs.shutdown, mp.Shutdown)
		ln, err := net.Listen("tcp", o.metricsAddr)
		if err != nil {
			return nil, fmt.Errorf("-metrics-addr %s: %w", o.metricsAddr, err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.Handler())
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		obs.shutdown = append(obs.shutdown, srv.Shutdown)
		fmt.Fprintf(out, "checkout: metrics at http://%s/metrics\n", ln.Addr())
	}
	return obs, nil
}

func (obs *observability) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i := len(obs.shutdown) - 1; i >= 0; i-- {
		_ = obs.shutdown[i](ctx)
	}
}

// printTrace prints the spans of the trace of saga id as a tree.
func (obs *observability) printTrace(out io.Writer, id uuid.UUID) error {
	if obs.recorder == nil {
		return nil
	}
	spans := obs.recorder.Ended()
	var traceID trace.TraceID
	for _, s := range spans {
		for _, kv := range s.Attributes() {
			if kv.Key == "sagabox.saga_id" && kv.Value.AsString() == id.String() {
				traceID = s.SpanContext().TraceID()
			}
		}
		if traceID.IsValid() {
			break
		}
	}
	if !traceID.IsValid() {
		return errors.New("no trace recorded for the saga")
	}
	children := map[trace.SpanID][]sdktrace.ReadOnlySpan{}
	var roots []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.SpanContext().TraceID() != traceID {
			continue
		}
		if s.Parent().IsValid() {
			children[s.Parent().SpanID()] = append(children[s.Parent().SpanID()], s)
		} else {
			roots = append(roots, s)
		}
	}
	byStart := func(list []sdktrace.ReadOnlySpan) {
		sort.Slice(list, func(i, j int) bool { return list[i].StartTime().Before(list[j].StartTime()) })
	}
	byStart(roots)
	if len(roots) == 0 {
		return errors.New("the saga's trace has no root span")
	}
	t0 := roots[0].StartTime()
	fmt.Fprintf(out, "\ntrace %s of saga %s:\n", traceID, id)
	var walk func(s sdktrace.ReadOnlySpan, depth int)
	walk = func(s sdktrace.ReadOnlySpan, depth int) {
		fmt.Fprintf(out, "  +%-9s %-9s %s%s%s\n", s.StartTime().Sub(t0).Round(100*time.Microsecond),
			s.EndTime().Sub(s.StartTime()).Round(10*time.Microsecond), strings.Repeat("  ", depth), s.Name(), spanNote(s))
		kids := children[s.SpanContext().SpanID()]
		byStart(kids)
		for _, k := range kids {
			walk(k, depth+1)
		}
	}
	for _, r := range roots {
		walk(r, 0)
	}
	return nil
}

// spanNote shows the attributes that say where a span ran.
func spanNote(s sdktrace.ReadOnlySpan) string {
	var notes []string
	for _, kv := range s.Attributes() {
		switch kv.Key {
		case "sagabox.component", "sagabox.inbox.outcome", "sagabox.outcome", "checkout.outcome":
			notes = append(notes, fmt.Sprintf("%s=%s", strings.TrimPrefix(string(kv.Key), "sagabox."), kv.Value.String()))
		}
	}
	if len(notes) == 0 {
		return ""
	}
	return "  [" + strings.Join(notes, " ") + "]"
}
