// Package service is one microservice of a topology: it serves its endpoints over HTTP/1.1 or
// gRPC, spends each endpoint's compute time, makes the endpoint's downstream calls (stages in
// sequence, the calls of a stage in parallel), and traces all of it.
package service

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	grpccodes "google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"meshtax/app/internal/topology"
	"meshtax/app/internal/tracing"
)

// Methods fortio's gRPC load (`fortio load -grpc [-ping]`) calls; both run the ping endpoint.
const (
	FortioPing   = "/fgrpc.PingServer/Ping"
	HealthCheck  = "/grpc.health.v1.Health/Check"
	padFieldNum  = 1000 // protobuf field number of the padding: unknown to fortio, so skipped
	callDeadline = 30 * time.Second
)

// Peer is where a downstream service listens and how to talk to it.
type Peer struct {
	Protocol topology.Protocol
	Addr     string // host:port
}

// ParsePeer reads "name=[scheme://]host:port"; without a scheme, def is the protocol.
func ParsePeer(s string, def func(name string) topology.Protocol) (string, Peer, error) {
	name, addr, ok := strings.Cut(s, "=")
	if !ok || name == "" || addr == "" {
		return "", Peer{}, fmt.Errorf("peer %q: want name=[http|grpc://]host:port", s)
	}
	p := Peer{Addr: addr}
	if scheme, rest, ok := strings.Cut(addr, "://"); ok {
		p.Protocol, p.Addr = topology.Protocol(scheme), rest
	} else {
		p.Protocol = def(name)
	}
	if p.Protocol != topology.HTTP && p.Protocol != topology.GRPC {
		return "", Peer{}, fmt.Errorf("peer %q: protocol %q is not http or grpc", s, p.Protocol)
	}
	if _, _, err := net.SplitHostPort(p.Addr); err != nil {
		return "", Peer{}, fmt.Errorf("peer %q: %v", s, err)
	}
	return name, p, nil
}

// Config of one service process.
type Config struct {
	Topology     *topology.Topology
	Service      string
	Protocol     topology.Protocol // "" means the topology's
	Peers        map[string]Peer
	PingEndpoint string // "" means the service's first endpoint
	Tracer       trace.Tracer
}

// Server is a running service.
type Server struct {
	cfg      Config
	svc      *topology.Service
	proto    topology.Protocol
	ping     *topology.Endpoint
	payload  []byte // shared request/response bytes: never written after New
	httpc    *http.Client
	conns    map[string]*grpc.ClientConn
	grpcSrv  *grpc.Server
	httpSrv  *http.Server
	Served   atomic.Uint64
	Failed   atomic.Uint64
	closeOne sync.Once
}

// rawCodec moves []byte messages untouched: a bytes-in/bytes-out service without protoc.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("raw codec: %T is not *[]byte", v)
	}
	return *b, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("raw codec: %T is not *[]byte", v)
	}
	*b = append((*b)[:0], data...)
	return nil
}

// Name is "proto" so the content-type is plain application/grpc(+proto), as real services send.
func (rawCodec) Name() string { return "proto" }

// New prepares the server and its client connections (gRPC dials lazily).
func New(cfg Config) (*Server, error) {
	svc := cfg.Topology.Services[cfg.Service]
	if svc == nil {
		return nil, fmt.Errorf("topology %s has no service %q", cfg.Topology.Name, cfg.Service)
	}
	s := &Server{cfg: cfg, svc: svc, proto: svc.Protocol, conns: map[string]*grpc.ClientConn{}}
	if cfg.Protocol != "" {
		s.proto = cfg.Protocol
	}
	pe := cfg.PingEndpoint
	if pe == "" {
		pe = svc.Order[0]
	}
	if s.ping = svc.Endpoints[pe]; s.ping == nil {
		return nil, fmt.Errorf("service %s has no endpoint %q (ping endpoint)", svc.Name, pe)
	}
	if cfg.Tracer == nil {
		s.cfg.Tracer = noop.NewTracerProvider().Tracer("")
	}
	max := 0
	for _, ep := range svc.Endpoints {
		max = maxInt(max, ep.ResponseBytes)
		for _, st := range ep.Stages {
			for _, c := range st {
				max = maxInt(max, c.RequestBytes)
			}
		}
	}
	s.payload = bytes.Repeat([]byte{'x'}, max)
	s.httpc = &http.Client{Transport: &http.Transport{
		// keep connections to each peer open and reused, as real clients do: a mesh's cost
		// per request must not include a TCP handshake per call
		MaxIdleConns:        4096,
		MaxIdleConnsPerHost: 1024,
		IdleConnTimeout:     5 * time.Minute,
		DisableCompression:  true,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
	}}
	for name, p := range cfg.Peers {
		if p.Protocol != topology.GRPC {
			continue
		}
		cc, err := grpc.NewClient("passthrough:///"+p.Addr,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})))
		if err != nil {
			return nil, fmt.Errorf("peer %s: %v", name, err)
		}
		s.conns[name] = cc
	}
	return s, nil
}

func maxInt(a, b int) int {
	if a > b {
		return a
	}
	return b
}

// Protocol the server speaks.
func (s *Server) Protocol() topology.Protocol { return s.proto }

// MissingPeers lists services this one calls but has no address for.
func (s *Server) MissingPeers() []string {
	var out []string
	seen := map[string]bool{}
	for _, en := range s.svc.Order {
		for _, st := range s.svc.Endpoints[en].Stages {
			for _, c := range st {
				if _, ok := s.cfg.Peers[c.Service]; !ok && !seen[c.Service] {
					seen[c.Service] = true
					out = append(out, c.Service)
				}
			}
		}
	}
	return out
}

// Serve serves on l until Close; it returns nil after Close.
func (s *Server) Serve(l net.Listener) error {
	if s.proto == topology.GRPC {
		s.grpcSrv = grpc.NewServer(
			grpc.ForceServerCodec(rawCodec{}),
			grpc.UnknownServiceHandler(s.handleGRPC),
			grpc.MaxConcurrentStreams(1<<20),
		)
		err := s.grpcSrv.Serve(l)
		if errors.Is(err, grpc.ErrServerStopped) {
			return nil
		}
		return err
	}
	s.httpSrv = &http.Server{Handler: http.HandlerFunc(s.handleHTTP), ReadHeaderTimeout: 10 * time.Second}
	err := s.httpSrv.Serve(l)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Close stops serving (in-flight requests finish first, up to ctx) and closes client conns.
func (s *Server) Close(ctx context.Context) {
	s.closeOne.Do(func() {
		if s.grpcSrv != nil {
			done := make(chan struct{})
			go func() { s.grpcSrv.GracefulStop(); close(done) }()
			select {
			case <-done:
			case <-ctx.Done():
				s.grpcSrv.Stop()
			}
		}
		if s.httpSrv != nil {
			_ = s.httpSrv.Shutdown(ctx)
		}
		for _, cc := range s.conns {
			_ = cc.Close()
		}
		s.httpc.CloseIdleConnections()
	})
}

// ---- the work of one request -----------------------------------------------------------------

// compute spends an endpoint's compute time.
func compute(d time.Duration, mode topology.ComputeMode) {
	if d <= 0 {
		return
	}
	if mode == topology.Sleep {
		time.Sleep(d)
		return
	}
	end := time.Now().Add(d)
	for time.Now().Before(end) {
	}
}

// Run does an endpoint's work: compute, then each stage's calls in parallel, stages in order.
func (s *Server) Run(ctx context.Context, ep *topology.Endpoint) error {
	compute(ep.Compute, ep.Mode)
	for _, st := range ep.Stages {
		if len(st) == 1 {
			if err := s.call(ctx, st[0]); err != nil {
				return err
			}
			continue
		}
		errs := make([]error, len(st))
		var wg sync.WaitGroup
		for i := range st {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				errs[i] = s.call(ctx, st[i])
			}(i)
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return err
		}
	}
	return nil
}

func (s *Server) call(ctx context.Context, c topology.Call) error {
	p, ok := s.cfg.Peers[c.Service]
	if !ok {
		return fmt.Errorf("no address for service %q (start with --peer %s=host:port)", c.Service, c.Service)
	}
	ctx, cancel := context.WithTimeout(ctx, callDeadline)
	defer cancel()
	host, port, _ := net.SplitHostPort(p.Addr)
	portN, _ := strconv.Atoi(port)
	req := s.payload[:c.RequestBytes]
	if p.Protocol == topology.GRPC {
		return s.callGRPC(ctx, c, p, host, portN, req)
	}
	return s.callHTTP(ctx, c, p, host, portN, req)
}

func (s *Server) callHTTP(ctx context.Context, c topology.Call, p Peer, host string, port int, req []byte) error {
	method := http.MethodPost
	if len(req) == 0 {
		method = http.MethodGet
	}
	url := "http://" + p.Addr + "/" + c.Endpoint
	ctx, span := s.cfg.Tracer.Start(ctx, method+" /"+c.Endpoint, trace.WithSpanKind(trace.SpanKindClient))
	defer span.End()
	hr, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(req))
	if err != nil {
		return fail(span, err)
	}
	if len(req) > 0 {
		hr.Header.Set("Content-Type", "application/octet-stream")
	}
	tracing.Propagator.Inject(ctx, headerCarrier(hr.Header))
	resp, err := s.httpc.Do(hr)
	if err != nil {
		return fail(span, err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if span.IsRecording() {
		span.SetAttributes(
			attribute.String("http.request.method", method),
			attribute.String("url.full", url),
			attribute.String("server.address", host),
			attribute.Int("server.port", port),
			attribute.String("peer.service", c.Service),
			attribute.Int("http.request.body.size", len(req)),
			attribute.Int64("http.response.body.size", n),
			attribute.Int("http.response.status_code", resp.StatusCode),
		)
	}
	if err != nil {
		return fail(span, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fail(span, fmt.Errorf("%s %s: HTTP %d", method, url, resp.StatusCode))
	}
	return nil
}

func (s *Server) callGRPC(ctx context.Context, c topology.Call, p Peer, host string, port int, req []byte) error {
	cc := s.conns[c.Service]
	method := "/" + c.Service + "/" + c.Endpoint
	ctx, span := s.cfg.Tracer.Start(ctx, c.Service+"/"+c.Endpoint, trace.WithSpanKind(trace.SpanKindClient))
	defer span.End()
	md := metadata.MD{}
	tracing.Propagator.Inject(ctx, mdCarrier(md))
	ctx = metadata.NewOutgoingContext(ctx, md)
	var resp []byte
	err := cc.Invoke(ctx, method, &req, &resp)
	if span.IsRecording() {
		span.SetAttributes(
			attribute.String("rpc.system", "grpc"),
			attribute.String("rpc.service", c.Service),
			attribute.String("rpc.method", c.Endpoint),
			attribute.Int("rpc.grpc.status_code", int(status.Code(err))),
			attribute.String("server.address", host),
			attribute.Int("server.port", port),
			attribute.String("peer.service", c.Service),
			attribute.Int("rpc.request.size", len(req)),
			attribute.Int("rpc.response.size", len(resp)),
		)
		span.AddEvent("message", trace.WithAttributes(attribute.String("rpc.message.type", "SENT"),
			attribute.Int("rpc.message.id", 1), attribute.Int("rpc.message.uncompressed_size", len(req))))
		if err == nil {
			span.AddEvent("message", trace.WithAttributes(attribute.String("rpc.message.type", "RECEIVED"),
				attribute.Int("rpc.message.id", 1), attribute.Int("rpc.message.uncompressed_size", len(resp))))
		}
	}
	if err != nil {
		return fail(span, fmt.Errorf("%s at %s: %w", method, p.Addr, err))
	}
	return nil
}

func fail(span trace.Span, err error) error {
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
	return err
}

// ---- serving -------------------------------------------------------------------------------

func (s *Server) handleHTTP(w http.ResponseWriter, r *http.Request) {
	name := strings.TrimPrefix(r.URL.Path, "/")
	ep := s.svc.Endpoints[name]
	if ep == nil {
		http.Error(w, fmt.Sprintf("service %s has no endpoint %q", s.svc.Name, name), http.StatusNotFound)
		return
	}
	ctx := tracing.Propagator.Extract(r.Context(), headerCarrier(r.Header))
	ctx, span := s.cfg.Tracer.Start(ctx, r.Method+" /"+name, trace.WithSpanKind(trace.SpanKindServer))
	defer span.End()
	n, _ := io.Copy(io.Discard, r.Body)
	code := http.StatusOK
	if err := s.Run(ctx, ep); err != nil {
		s.Failed.Add(1)
		code = http.StatusBadGateway
		fail(span, err)
		http.Error(w, err.Error(), code)
	} else {
		s.Served.Add(1)
		w.Header().Set("Content-Length", strconv.Itoa(ep.ResponseBytes))
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(code)
		w.Write(s.payload[:ep.ResponseBytes])
	}
	if span.IsRecording() {
		resp := ep.ResponseBytes
		if code != http.StatusOK {
			resp = 0
		}
		span.SetAttributes(
			attribute.String("http.request.method", r.Method),
			attribute.String("url.path", r.URL.Path),
			attribute.String("http.route", "/"+name),
			attribute.Int64("http.request.body.size", n),
			attribute.Int("http.response.body.size", resp),
			attribute.Int("http.response.status_code", code),
		)
	}
}

// pad appends a length-delimited unknown field so msg is size bytes long (one byte short in
// the rare case no length prefix fits exactly).
func pad(msg []byte, size int) []byte {
	remain := size - len(msg) - protowire.SizeTag(padFieldNum)
	n := -1
	for k := 1; k <= 3 && n < 0; k++ {
		if c := remain - k; c >= 0 && protowire.SizeVarint(uint64(c)) == k {
			n = c
		}
	}
	if n < 0 && remain >= 2 {
		n = remain - 2 // e.g. remain 129: 128 needs a 2-byte length, 127 a 1-byte one
	}
	if n < 0 {
		return msg
	}
	msg = protowire.AppendTag(msg, padFieldNum, protowire.BytesType)
	msg = protowire.AppendVarint(msg, uint64(n))
	return append(msg, make([]byte, n)...)
}

func (s *Server) handleGRPC(_ any, stream grpc.ServerStream) error {
	method, _ := grpc.MethodFromServerStream(stream)
	var req []byte
	if err := stream.RecvMsg(&req); err != nil {
		return err
	}
	received := time.Now()
	ctx := stream.Context()
	md, _ := metadata.FromIncomingContext(ctx)
	ctx = tracing.Propagator.Extract(ctx, mdCarrier(md))
	var ep *topology.Endpoint
	var resp []byte
	switch method {
	case FortioPing:
		// fortio checks nothing but the echo: return its message, padded to the response size
		ep = s.ping
		resp = pad(append([]byte(nil), req...), ep.ResponseBytes)
	case HealthCheck:
		ep = s.ping
		resp = pad([]byte{0x08, 0x01}, ep.ResponseBytes) // HealthCheckResponse{status: SERVING}
	default:
		svc, name, _ := strings.Cut(strings.TrimPrefix(method, "/"), "/")
		if svc != s.svc.Name || s.svc.Endpoints[name] == nil {
			return status.Errorf(grpccodes.Unimplemented, "service %s has no method %s", s.svc.Name, method)
		}
		ep = s.svc.Endpoints[name]
		resp = s.payload[:ep.ResponseBytes]
	}
	ctx, span := s.cfg.Tracer.Start(ctx, strings.TrimPrefix(method, "/"), trace.WithSpanKind(trace.SpanKindServer))
	defer span.End()
	err := s.Run(ctx, ep)
	if err != nil {
		s.Failed.Add(1)
		fail(span, err)
		resp = nil
	} else {
		s.Served.Add(1)
	}
	if span.IsRecording() {
		svc, m, _ := strings.Cut(strings.TrimPrefix(method, "/"), "/")
		code := grpccodes.OK
		if err != nil {
			code = grpccodes.Internal
		}
		span.SetAttributes(
			attribute.String("rpc.system", "grpc"),
			attribute.String("rpc.service", svc),
			attribute.String("rpc.method", m),
			attribute.Int("rpc.grpc.status_code", int(code)),
			attribute.Int("rpc.request.size", len(req)),
			attribute.Int("rpc.response.size", len(resp)),
		)
		span.AddEvent("message", trace.WithTimestamp(received), trace.WithAttributes(attribute.String("rpc.message.type", "RECEIVED"),
			attribute.Int("rpc.message.id", 1), attribute.Int("rpc.message.uncompressed_size", len(req))))
		if err == nil {
			span.AddEvent("message", trace.WithAttributes(attribute.String("rpc.message.type", "SENT"),
				attribute.Int("rpc.message.id", 1), attribute.Int("rpc.message.uncompressed_size", len(resp))))
		}
	}
	if err != nil {
		return status.Errorf(grpccodes.Internal, "%s: %v", method, err)
	}
	return stream.SendMsg(&resp)
}

// ---- carriers ------------------------------------------------------------------------------

type headerCarrier http.Header

func (h headerCarrier) Get(k string) string { return http.Header(h).Get(k) }
func (h headerCarrier) Set(k, v string)     { http.Header(h).Set(k, v) }
func (h headerCarrier) Keys() []string {
	out := make([]string, 0, len(h))
	for k := range h {
		out = append(out, k)
	}
	return out
}

type mdCarrier metadata.MD

func (m mdCarrier) Get(k string) string {
	if v := metadata.MD(m).Get(k); len(v) > 0 {
		return v[0]
	}
	return ""
}
func (m mdCarrier) Set(k, v string) { metadata.MD(m).Set(k, v) }
func (m mdCarrier) Keys() []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
