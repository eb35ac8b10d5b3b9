// Command meshapp runs one service of a topology file (see app/README.md).
//
//	meshapp --topology bookinfo.yaml --service reviews --listen 0.0.0.0:9080 \
//	        --peer ratings=grpc://10.77.0.6:9080 --trace-file reviews.otlp.jsonl --sample 10
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"meshtax/app/internal/service"
	"meshtax/app/internal/topology"
	"meshtax/app/internal/tracing"
)

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "meshapp:", err)
		os.Exit(1)
	}
}

func run() error {
	var peers multi
	topo := flag.String("topology", "", "topology YAML file (required)")
	name := flag.String("service", "", "service of the topology to run (required)")
	listen := flag.String("listen", "0.0.0.0:8080", "address to serve on")
	proto := flag.String("protocol", "", "serve http or grpc instead of the topology's protocol")
	flag.Var(&peers, "peer", "downstream address, name=[http|grpc://]host:port (repeat; no scheme: the topology's protocol)")
	ping := flag.String("ping-endpoint", "", "endpoint run by fortio's gRPC ping/health calls (default: the first)")
	traceFile := flag.String("trace-file", "", "append OTLP/JSON lines here (empty: no tracing)")
	sample := flag.Uint64("sample", 1, "trace 1 in N entry requests (0: none); downstream services follow the caller")
	batch := flag.Duration("trace-batch-timeout", time.Second, "longest a finished span waits before it is written")
	ready := flag.String("ready-file", "", "write the listening address here once serving (for orchestrators)")
	procs := flag.Int("procs", 0, "GOMAXPROCS (0: Go's default, the CPUs the process may use)")
	flag.Parse()
	if *procs > 0 {
		// with many services on few cores, idle Ps spinning for work compete with the other
		// services and the sidecars: 1 P per service measured faster on a 2-core machine
		runtime.GOMAXPROCS(*procs)
	}
	if *topo == "" || *name == "" {
		flag.Usage()
		return fmt.Errorf("--topology and --service are required")
	}
	t, err := topology.Load(*topo)
	if err != nil {
		return err
	}
	def := func(n string) topology.Protocol {
		if s := t.Services[n]; s != nil {
			return s.Protocol
		}
		return topology.HTTP
	}
	pm := map[string]service.Peer{}
	for _, p := range peers {
		n, peer, err := service.ParsePeer(p, def)
		if err != nil {
			return err
		}
		pm[n] = peer
	}
	if *proto != "" && *proto != string(topology.HTTP) && *proto != string(topology.GRPC) {
		return fmt.Errorf("--protocol %q: want http or grpc", *proto)
	}
	tr, err := tracing.New(*name, *traceFile, *sample, *batch)
	if err != nil {
		return err
	}
	srv, err := service.New(service.Config{
		Topology: t, Service: *name, Protocol: topology.Protocol(*proto), Peers: pm,
		PingEndpoint: *ping, Tracer: tr.Tracer,
	})
	if err != nil {
		return err
	}
	if miss := srv.MissingPeers(); len(miss) > 0 {
		// not fatal: a query may use only some endpoints; calls to these fail at request time
		fmt.Fprintf(os.Stderr, "meshapp: %s: no --peer for %s\n", *name, strings.Join(miss, ", "))
	}
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	if *ready != "" {
		if err := os.WriteFile(*ready, []byte(l.Addr().String()+"\n"), 0o644); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "meshapp: %s serving %s on %s\n", *name, srv.Protocol(), l.Addr())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case err = <-errc:
	case <-sig:
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	srv.Close(ctx)
	// flush the spans before exit: the trace file is the point of the run
	if serr := tr.Shutdown(ctx); serr != nil && err == nil {
		err = serr
	}
	fmt.Fprintf(os.Stderr, "meshapp: %s served %d, failed %d\n", *name, srv.Served.Load(), srv.Failed.Load())
	return err
}
