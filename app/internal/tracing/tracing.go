// Package tracing sets up the OpenTelemetry SDK for one service: a deterministic 1-in-N
// head sampler, W3C trace-context propagation, and an exporter that writes OTLP/JSON.
//
// The SDK's stdouttrace exporter writes its own span-stub JSON, not OTLP, so the exporter
// here encodes spans as OTLP/JSON (the proto3 JSON mapping of TracesData, with hex trace and
// span ids as the OTLP spec requires): one TracesData object per line, as the OpenTelemetry
// Collector's file exporter does.
package tracing

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// ScopeName is the instrumentation scope of every span the app emits.
const ScopeName = "meshtax/meshapp"

// Propagator is W3C trace context (traceparent/tracestate).
var Propagator = propagation.TraceContext{}

// EveryN samples one root span in N, deterministically (a counter, not a coin), so a run of
// k×N requests traces exactly k of them. Children follow their parent (wrap in ParentBased).
type EveryN struct {
	N     uint64
	count atomic.Uint64
}

// ShouldSample implements sdktrace.Sampler.
func (s *EveryN) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	ts := trace.SpanContextFromContext(p.ParentContext).TraceState()
	if s.N > 0 && (s.count.Add(1)-1)%s.N == 0 {
		return sdktrace.SamplingResult{Decision: sdktrace.RecordAndSample, Tracestate: ts}
	}
	return sdktrace.SamplingResult{Decision: sdktrace.Drop, Tracestate: ts}
}

// Description implements sdktrace.Sampler.
func (s *EveryN) Description() string { return fmt.Sprintf("EveryN{%d}", s.N) }

// Setup is a configured tracer and its shutdown.
type Setup struct {
	Tracer   trace.Tracer
	Shutdown func(context.Context) error
}

// New returns a tracer for service that samples 1 in sampleN entry requests (0: never; the
// tracer is then a no-op) and writes spans to path as OTLP/JSON lines.
func New(service, path string, sampleN uint64, batchTimeout time.Duration) (*Setup, error) {
	if sampleN == 0 || path == "" {
		return &Setup{Tracer: noop.NewTracerProvider().Tracer(ScopeName), Shutdown: func(context.Context) error { return nil }}, nil
	}
	exp, err := NewFileExporter(path)
	if err != nil {
		return nil, err
	}
	res := resource.NewSchemaless(
		attribute.String("service.name", service),
		attribute.Int("process.pid", os.Getpid()),
	)
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithSampler(sdktrace.ParentBased(&EveryN{N: sampleN})),
		sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(batchTimeout), sdktrace.WithMaxQueueSize(65536)),
		sdktrace.WithResource(res),
	)
	return &Setup{Tracer: tp.Tracer(ScopeName), Shutdown: tp.Shutdown}, nil
}

// FileExporter writes each exported batch as one OTLP/JSON TracesData line.
type FileExporter struct {
	mu sync.Mutex
	f  *os.File
	w  *bufio.Writer
}

// NewFileExporter appends to path (created if missing).
func NewFileExporter(path string) (*FileExporter, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &FileExporter{f: f, w: bufio.NewWriterSize(f, 1<<16)}, nil
}

// ExportSpans implements sdktrace.SpanExporter.
func (e *FileExporter) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	if len(spans) == 0 {
		return nil
	}
	b, err := json.Marshal(Encode(spans))
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.w == nil {
		return nil
	}
	e.w.Write(b)
	e.w.WriteByte('\n')
	// flushed per batch: a reader sees whole lines, and a SIGKILL loses at most one batch
	return e.w.Flush()
}

// Shutdown implements sdktrace.SpanExporter.
func (e *FileExporter) Shutdown(context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.w == nil {
		return nil
	}
	err := e.w.Flush()
	if cerr := e.f.Close(); err == nil {
		err = cerr
	}
	e.w = nil
	return err
}

// ---- OTLP/JSON shapes (opentelemetry-proto, proto3 JSON mapping) -----------------------------

// AnyValue holds exactly one of its fields; 64-bit ints are strings in proto3 JSON.
type AnyValue struct {
	StringValue *string  `json:"stringValue,omitempty"`
	IntValue    *string  `json:"intValue,omitempty"`
	DoubleValue *float64 `json:"doubleValue,omitempty"`
	BoolValue   *bool    `json:"boolValue,omitempty"`
}

// KeyValue is one attribute.
type KeyValue struct {
	Key   string   `json:"key"`
	Value AnyValue `json:"value"`
}

// Event is a span event.
type Event struct {
	TimeUnixNano string     `json:"timeUnixNano"`
	Name         string     `json:"name"`
	Attributes   []KeyValue `json:"attributes,omitempty"`
}

// Status is a span status (0 unset, 1 ok, 2 error).
type Status struct {
	Code    int    `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
}

// Span is an OTLP span.
type Span struct {
	TraceID           string     `json:"traceId"`
	SpanID            string     `json:"spanId"`
	TraceState        string     `json:"traceState,omitempty"`
	ParentSpanID      string     `json:"parentSpanId,omitempty"`
	Name              string     `json:"name"`
	Kind              int        `json:"kind"`
	StartTimeUnixNano string     `json:"startTimeUnixNano"`
	EndTimeUnixNano   string     `json:"endTimeUnixNano"`
	Attributes        []KeyValue `json:"attributes,omitempty"`
	Events            []Event    `json:"events,omitempty"`
	Status            Status     `json:"status"`
}

// Scope is an instrumentation scope.
type Scope struct {
	Name string `json:"name"`
}

// ScopeSpans groups spans by scope.
type ScopeSpans struct {
	Scope Scope  `json:"scope"`
	Spans []Span `json:"spans"`
}

// Resource is the emitting entity.
type Resource struct {
	Attributes []KeyValue `json:"attributes"`
}

// ResourceSpans groups scopes by resource.
type ResourceSpans struct {
	Resource   Resource     `json:"resource"`
	ScopeSpans []ScopeSpans `json:"scopeSpans"`
}

// TracesData is the top-level OTLP/JSON document (same shape as ExportTraceServiceRequest).
type TracesData struct {
	ResourceSpans []ResourceSpans `json:"resourceSpans"`
}

func value(v attribute.Value) AnyValue {
	switch v.Type() {
	case attribute.BOOL:
		b := v.AsBool()
		return AnyValue{BoolValue: &b}
	case attribute.INT64:
		s := strconv.FormatInt(v.AsInt64(), 10)
		return AnyValue{IntValue: &s}
	case attribute.FLOAT64:
		f := v.AsFloat64()
		return AnyValue{DoubleValue: &f}
	default:
		s := v.Emit()
		return AnyValue{StringValue: &s}
	}
}

func kvs(attrs []attribute.KeyValue) []KeyValue {
	out := make([]KeyValue, len(attrs))
	for i, a := range attrs {
		out[i] = KeyValue{Key: string(a.Key), Value: value(a.Value)}
	}
	return out
}

func nanos(t time.Time) string { return strconv.FormatInt(t.UnixNano(), 10) }

// Encode converts SDK spans to one OTLP TracesData, one ResourceSpans per distinct resource.
func Encode(spans []sdktrace.ReadOnlySpan) TracesData {
	var td TracesData
	index := map[*resource.Resource]int{}
	for _, s := range spans {
		i, ok := index[s.Resource()]
		if !ok {
			i = len(td.ResourceSpans)
			index[s.Resource()] = i
			td.ResourceSpans = append(td.ResourceSpans, ResourceSpans{
				Resource:   Resource{Attributes: kvs(s.Resource().Attributes())},
				ScopeSpans: []ScopeSpans{{Scope: Scope{Name: s.InstrumentationScope().Name}}},
			})
		}
		sc := s.SpanContext()
		o := Span{
			TraceID:           sc.TraceID().String(),
			SpanID:            sc.SpanID().String(),
			TraceState:        sc.TraceState().String(),
			Name:              s.Name(),
			Kind:              int(s.SpanKind()), // trace.SpanKind matches the OTLP enum values
			StartTimeUnixNano: nanos(s.StartTime()),
			EndTimeUnixNano:   nanos(s.EndTime()),
			Attributes:        kvs(s.Attributes()),
		}
		if p := s.Parent(); p.SpanID().IsValid() {
			o.ParentSpanID = p.SpanID().String()
		}
		for _, ev := range s.Events() {
			o.Events = append(o.Events, Event{TimeUnixNano: nanos(ev.Time), Name: ev.Name, Attributes: kvs(ev.Attributes)})
		}
		switch s.Status().Code {
		case codes.Ok:
			o.Status = Status{Code: 1}
		case codes.Error:
			o.Status = Status{Code: 2, Message: s.Status().Description}
		}
		rs := &td.ResourceSpans[i]
		rs.ScopeSpans[0].Spans = append(rs.ScopeSpans[0].Spans, o)
	}
	return td
}
