package tracing

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

func TestEveryN(t *testing.T) {
	for _, n := range []uint64{1, 3, 10} {
		s := &EveryN{N: n}
		got := 0
		for i := 0; i < 30; i++ {
			if s.ShouldSample(sdktrace.SamplingParameters{ParentContext: context.Background()}).Decision == sdktrace.RecordAndSample {
				got++
			}
		}
		if got != int(30/n) {
			t.Errorf("N=%d: sampled %d of 30, want %d", n, got, 30/n)
		}
	}
	if (&EveryN{N: 0}).ShouldSample(sdktrace.SamplingParameters{ParentContext: context.Background()}).Decision != sdktrace.Drop {
		t.Error("N=0 sampled")
	}
}

// Children follow the parent's sampled flag, carried by traceparent.
func TestParentBasedFollowsTraceparent(t *testing.T) {
	dir := t.TempDir()
	setup, err := New("svc", filepath.Join(dir, "t.jsonl"), 1000, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer setup.Shutdown(context.Background())
	carrier := propagation.MapCarrier{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	ctx := Propagator.Extract(context.Background(), carrier)
	_, span := setup.Tracer.Start(ctx, "child", trace.WithSpanKind(trace.SpanKindServer))
	if !span.SpanContext().IsSampled() || span.SpanContext().TraceID().String() != "0af7651916cd43dd8448eb211c80319c" {
		t.Errorf("sampled parent: child sampled=%v trace %s", span.SpanContext().IsSampled(), span.SpanContext().TraceID())
	}
	span.End()
	carrier["traceparent"] = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
	_, span = setup.Tracer.Start(Propagator.Extract(context.Background(), carrier), "child")
	if span.SpanContext().IsSampled() {
		t.Error("unsampled parent: child sampled")
	}
	span.End()
}

func TestFileExporterWritesOTLPJSONLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "spans.jsonl")
	setup, err := New("reviews", path, 1, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ctx, root := setup.Tracer.Start(context.Background(), "GET /x", trace.WithSpanKind(trace.SpanKindServer))
	root.SetAttributes(attribute.Int("http.response.body.size", 42), attribute.String("s", "v"), attribute.Bool("b", true), attribute.Float64("f", 0.5))
	_, child := setup.Tracer.Start(ctx, "ratings/get", trace.WithSpanKind(trace.SpanKindClient))
	child.AddEvent("message", trace.WithAttributes(attribute.Int("rpc.message.uncompressed_size", 9)))
	child.SetStatus(codes.Error, "boom")
	child.End()
	root.End()
	if err := setup.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var spans []map[string]any
	var svc string
	sc := bufio.NewScanner(f)
	lines := 0
	for sc.Scan() {
		lines++
		var td map[string]any
		if err := json.Unmarshal(sc.Bytes(), &td); err != nil {
			t.Fatalf("line %d: %v", lines, err)
		}
		for _, rs := range td["resourceSpans"].([]any) {
			rsm := rs.(map[string]any)
			for _, a := range rsm["resource"].(map[string]any)["attributes"].([]any) {
				if a.(map[string]any)["key"] == "service.name" {
					svc = a.(map[string]any)["value"].(map[string]any)["stringValue"].(string)
				}
			}
			for _, ss := range rsm["scopeSpans"].([]any) {
				for _, s := range ss.(map[string]any)["spans"].([]any) {
					spans = append(spans, s.(map[string]any))
				}
			}
		}
	}
	if lines != 1 || len(spans) != 2 || svc != "reviews" {
		t.Fatalf("%d lines, %d spans, service %q", lines, len(spans), svc)
	}
	c, r := spans[0], spans[1]
	if c["kind"].(float64) != 3 || r["kind"].(float64) != 2 {
		t.Errorf("kinds %v %v, want 3 (client) 2 (server)", c["kind"], r["kind"])
	}
	if c["parentSpanId"] != r["spanId"] || c["traceId"] != r["traceId"] || r["parentSpanId"] != nil {
		t.Errorf("parentage: %v", spans)
	}
	if len(r["traceId"].(string)) != 32 || len(r["spanId"].(string)) != 16 {
		t.Errorf("ids not hex: %v %v", r["traceId"], r["spanId"])
	}
	if _, ok := r["startTimeUnixNano"].(string); !ok {
		t.Errorf("startTimeUnixNano not a string: %T", r["startTimeUnixNano"])
	}
	want := map[string]map[string]any{
		"http.response.body.size": {"intValue": "42"},
		"s":                       {"stringValue": "v"},
		"b":                       {"boolValue": true},
		"f":                       {"doubleValue": 0.5},
	}
	for _, a := range r["attributes"].([]any) {
		am := a.(map[string]any)
		w := want[am["key"].(string)]
		for k, v := range w {
			if am["value"].(map[string]any)[k] != v {
				t.Errorf("attribute %s = %v, want %s %v", am["key"], am["value"], k, v)
			}
		}
	}
	if st := c["status"].(map[string]any); st["code"].(float64) != 2 || st["message"] != "boom" {
		t.Errorf("status %v", st)
	}
	if ev := c["events"].([]any); len(ev) != 1 {
		t.Errorf("events %v", ev)
	}
}
