package service

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protowire"

	"meshtax/app/internal/topology"
)

// app runs every service of a topology in this process on loopback ports, all tracing
// every request into one in-memory exporter.
type app struct {
	addrs   map[string]string
	servers []*Server
	exp     *tracetest.InMemoryExporter
	tps     []*sdktrace.TracerProvider
}

func startApp(t *testing.T, yml string) *app {
	t.Helper()
	topo, err := topology.Parse([]byte(yml))
	if err != nil {
		t.Fatal(err)
	}
	a := &app{addrs: map[string]string{}, exp: tracetest.NewInMemoryExporter()}
	ls := map[string]net.Listener{}
	peers := map[string]Peer{}
	for _, name := range topo.Order {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls[name] = l
		a.addrs[name] = l.Addr().String()
		peers[name] = Peer{Protocol: topo.Services[name].Protocol, Addr: l.Addr().String()}
	}
	for _, name := range topo.Order {
		// one provider per service, as in separate processes; synchronous export for the test
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(a.exp))
		a.tps = append(a.tps, tp)
		s, err := New(Config{Topology: topo, Service: name, Peers: peers, Tracer: tp.Tracer("test-" + name)})
		if err != nil {
			t.Fatal(err)
		}
		a.servers = append(a.servers, s)
		go s.Serve(ls[name])
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		for _, s := range a.servers {
			s.Close(ctx)
		}
	})
	return a
}

func (a *app) get(t *testing.T, service, endpoint string) []byte {
	t.Helper()
	resp, err := http.Get("http://" + a.addrs[service] + "/" + endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("HTTP %d: %s", resp.StatusCode, b)
	}
	return b
}

func attr(s tracetest.SpanStub, key string) (attribute.Value, bool) {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

func spansBy(stubs tracetest.SpanStubs, kind trace.SpanKind, name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range stubs {
		if s.SpanKind == kind && s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

const stagesYAML = `
name: stages
defaults: {compute: sleep, compute_us: 0, response_bytes: 10}
services:
  front:
    protocol: http
    endpoints:
      go:
        stages:
          - [{call: slow.a, request_bytes: 1}, {call: slow.b, request_bytes: 2}]
          - {call: slow.c, request_bytes: 3}
  slow:
    protocol: %s
    endpoints:
      a: {compute_us: 30000}
      b: {compute_us: 30000}
      c: {compute_us: 30000}
`

// Calls of a stage overlap in time; a later stage starts after the earlier one ended.
func TestStagesParallelThenSequential(t *testing.T) {
	for _, proto := range []string{"http", "grpc"} {
		t.Run(proto, func(t *testing.T) {
			a := startApp(t, fmt.Sprintf(stagesYAML, proto))
			a.get(t, "front", "go")
			stubs := a.exp.GetSpans()
			name := func(ep string) string {
				if proto == "grpc" {
					return "slow/" + ep
				}
				return "POST /" + ep
			}
			ca, cb, cc := spansBy(stubs, trace.SpanKindClient, name("a")), spansBy(stubs, trace.SpanKindClient, name("b")), spansBy(stubs, trace.SpanKindClient, name("c"))
			if len(ca) != 1 || len(cb) != 1 || len(cc) != 1 {
				t.Fatalf("client spans a=%d b=%d c=%d of %d", len(ca), len(cb), len(cc), len(stubs))
			}
			// parallel: each started before the other ended (each lasts >= 30 ms)
			if !(ca[0].StartTime.Before(cb[0].EndTime) && cb[0].StartTime.Before(ca[0].EndTime)) {
				t.Errorf("stage 1 calls did not overlap: a %v-%v b %v-%v", ca[0].StartTime, ca[0].EndTime, cb[0].StartTime, cb[0].EndTime)
			}
			// sequential: c starts after both a and b ended
			if cc[0].StartTime.Before(ca[0].EndTime) || cc[0].StartTime.Before(cb[0].EndTime) {
				t.Errorf("stage 2 started before stage 1 ended")
			}
			if d := ca[0].EndTime.Sub(ca[0].StartTime); d < 30*time.Millisecond {
				t.Errorf("compute time not spent: call took %v", d)
			}
		})
	}
}

const chainYAML = `
name: chain
defaults: {compute_us: 0}
services:
  front:
    protocol: http
    endpoints:
      entry:
        response_bytes: 123
        stages:
          - {call: mid.work, request_bytes: 77}
  mid:
    protocol: grpc
    endpoints:
      work:
        response_bytes: 321
        stages:
          - {call: leaf.get, request_bytes: 55}
  leaf:
    protocol: http
    endpoints:
      get: {response_bytes: 444, compute: spin, compute_us: 200}
`

func intAttr(t *testing.T, s tracetest.SpanStub, key string) int64 {
	t.Helper()
	v, ok := attr(s, key)
	if !ok {
		t.Fatalf("span %q has no %s", s.Name, key)
	}
	return v.AsInt64()
}

// Every hop has a CLIENT span in the caller and a SERVER span in the callee whose parent it
// is; sizes are the configured ones under the semantic-convention names.
func TestSpansSizesAndParents(t *testing.T) {
	a := startApp(t, chainYAML)
	body := a.get(t, "front", "entry")
	if len(body) != 123 {
		t.Fatalf("response %d bytes, want 123", len(body))
	}
	stubs := a.exp.GetSpans()
	if len(stubs) != 5 {
		t.Fatalf("%d spans, want 5 (3 server + 2 client)", len(stubs))
	}
	fs := spansBy(stubs, trace.SpanKindServer, "GET /entry")
	mc := spansBy(stubs, trace.SpanKindClient, "mid/work")
	ms := spansBy(stubs, trace.SpanKindServer, "mid/work")
	lc := spansBy(stubs, trace.SpanKindClient, "POST /get")
	ls := spansBy(stubs, trace.SpanKindServer, "POST /get")
	for _, g := range [][]tracetest.SpanStub{fs, mc, ms, lc, ls} {
		if len(g) != 1 {
			t.Fatalf("span groups %d %d %d %d %d", len(fs), len(mc), len(ms), len(lc), len(ls))
		}
	}
	tid := fs[0].SpanContext.TraceID()
	for _, s := range stubs {
		if s.SpanContext.TraceID() != tid {
			t.Errorf("span %s in another trace", s.Name)
		}
	}
	if fs[0].Parent.IsValid() {
		t.Errorf("entry span has a parent")
	}
	parentOf := []struct{ child, parent tracetest.SpanStub }{{mc[0], fs[0]}, {ms[0], mc[0]}, {lc[0], ms[0]}, {ls[0], lc[0]}}
	for _, p := range parentOf {
		if p.child.Parent.SpanID() != p.parent.SpanContext.SpanID() {
			t.Errorf("%s %v: parent is not %s %v", p.child.Name, p.child.SpanKind, p.parent.Name, p.parent.SpanKind)
		}
	}
	sizes := []struct {
		s    tracetest.SpanStub
		key  string
		want int64
	}{
		{fs[0], "http.request.body.size", 0},
		{fs[0], "http.response.body.size", 123},
		{mc[0], "rpc.request.size", 77},
		{mc[0], "rpc.response.size", 321},
		{ms[0], "rpc.request.size", 77},
		{ms[0], "rpc.response.size", 321},
		{lc[0], "http.request.body.size", 55},
		{lc[0], "http.response.body.size", 444},
		{ls[0], "http.request.body.size", 55},
		{ls[0], "http.response.body.size", 444},
	}
	for _, c := range sizes {
		if got := intAttr(t, c.s, c.key); got != c.want {
			t.Errorf("%s %v %s = %d, want %d", c.s.Name, c.s.SpanKind, c.key, got, c.want)
		}
	}
	if v, _ := attr(mc[0], "peer.service"); v.AsString() != "mid" {
		t.Errorf("peer.service %q", v.AsString())
	}
	if d := ls[0].EndTime.Sub(ls[0].StartTime); d < 200*time.Microsecond {
		t.Errorf("spin compute not spent: leaf took %v", d)
	}
}

func TestDownstreamFailureIs502(t *testing.T) {
	topo, err := topology.Parse([]byte(chainYAML))
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Topology: topo, Service: "front", Peers: map[string]Peer{}})
	if err != nil {
		t.Fatal(err)
	}
	if m := s.MissingPeers(); len(m) != 1 || m[0] != "mid" {
		t.Errorf("missing peers %v", m)
	}
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	go s.Serve(l)
	defer s.Close(context.Background())
	resp, err := http.Get("http://" + l.Addr().String() + "/entry")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 502 || !strings.Contains(string(b), `no address for service "mid"`) {
		t.Errorf("HTTP %d %s", resp.StatusCode, b)
	}
	resp, _ = http.Get("http://" + l.Addr().String() + "/nope")
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Errorf("unknown endpoint: HTTP %d", resp.StatusCode)
	}
}

func TestPad(t *testing.T) {
	for _, c := range []struct{ msg, size, want int }{
		{0, 300, 300}, {10, 300, 300}, {10, 11, 10}, {10, 12, 10}, {10, 13, 13}, {10, 140, 140},
		{0, 5000, 5000}, {400, 300, 400},
		{0, 131, 130}, // 129 bytes after the tag: no length prefix fits exactly, one short
	} {
		msg := make([]byte, c.msg)
		out := pad(msg, c.size)
		want := c.want
		if len(out) != want {
			t.Errorf("pad(%d, %d) = %d bytes", c.msg, c.size, len(out))
		}
		// what follows the message must parse as one protobuf field fortio will skip
		rest := out[c.msg:]
		for len(rest) > 0 {
			num, typ, n := protowire.ConsumeField(rest)
			if n < 0 || num != padFieldNum || typ != protowire.BytesType {
				t.Fatalf("pad(%d, %d): bad field %d %d %d", c.msg, c.size, num, typ, n)
			}
			rest = rest[n:]
		}
	}
}

// fortio's gRPC ping and health calls run the ping endpoint and get a parseable answer.
func TestFortioPingAndHealth(t *testing.T) {
	a := startApp(t, `
name: p
services:
  g:
    protocol: grpc
    endpoints:
      first: {compute_us: 0, response_bytes: 200, stages: [{call: h.x, request_bytes: 9}]}
  h:
    protocol: grpc
    endpoints:
      x: {compute_us: 0, response_bytes: 1}
`)
	cc, err := grpc.NewClient("passthrough:///"+a.addrs["g"], grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	// PingMessage{seq: 7, payload: "hi"}
	req := protowire.AppendTag(nil, 1, protowire.VarintType)
	req = protowire.AppendVarint(req, 7)
	req = protowire.AppendTag(req, 3, protowire.BytesType)
	req = protowire.AppendString(req, "hi")
	var resp []byte
	if err := cc.Invoke(context.Background(), FortioPing, &req, &resp); err != nil {
		t.Fatal(err)
	}
	if len(resp) != 200 || string(resp[:len(req)]) != string(req) {
		t.Errorf("ping answer %d bytes, prefix %x", len(resp), resp[:len(req)])
	}
	var hresp []byte
	empty := []byte{}
	if err := cc.Invoke(context.Background(), HealthCheck, &empty, &hresp); err != nil {
		t.Fatal(err)
	}
	if hresp[0] != 0x08 || hresp[1] != 0x01 {
		t.Errorf("health answer %x", hresp[:2])
	}
	if n := len(spansBy(a.exp.GetSpans(), trace.SpanKindClient, "h/x")); n != 2 {
		t.Errorf("ping endpoint ran %d times, want 2", n)
	}
	if err := cc.Invoke(context.Background(), "/g/nope", &empty, &hresp); err == nil || !strings.Contains(err.Error(), "Unimplemented") {
		t.Errorf("unknown method: %v", err)
	}
}

func TestParsePeer(t *testing.T) {
	def := func(string) topology.Protocol { return topology.GRPC }
	n, p, err := ParsePeer("a=10.0.0.2:80", def)
	if err != nil || n != "a" || p != (Peer{topology.GRPC, "10.0.0.2:80"}) {
		t.Errorf("%s %+v %v", n, p, err)
	}
	n, p, err = ParsePeer("b=http://127.0.0.1:9", def)
	if err != nil || n != "b" || p != (Peer{topology.HTTP, "127.0.0.1:9"}) {
		t.Errorf("%s %+v %v", n, p, err)
	}
	for _, bad := range []string{"a", "=1.2.3.4:5", "a=ftp://1.2.3.4:5", "a=1.2.3.4"} {
		if _, _, err := ParsePeer(bad, def); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
