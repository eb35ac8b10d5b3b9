// Package topology reads the YAML file that describes a microservice application: services,
// their endpoints, the simulated compute time and response size of each endpoint, and the
// downstream calls each endpoint makes in sequential stages of parallel calls.
package topology

import (
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Protocol a service serves (and is called with).
type Protocol string

const (
	HTTP Protocol = "http" // HTTP/1.1, POST (GET when the request is empty) on /<endpoint>
	GRPC Protocol = "grpc" // gRPC unary call /<service>/<endpoint>, raw bytes messages
)

// ComputeMode is how an endpoint spends its simulated compute time.
type ComputeMode string

const (
	// Spin burns CPU until the time has passed: the service's CPU use is then real, as in an
	// application doing work, and it competes for cores with the sidecars like real work does.
	Spin ComputeMode = "spin"
	// Sleep only waits: latency without CPU (a stand-in for I/O-bound work).
	Sleep ComputeMode = "sleep"
)

// Call is one downstream invocation.
type Call struct {
	Service      string `yaml:"-"`
	Endpoint     string `yaml:"-"`
	RequestBytes int    `yaml:"request_bytes"`
}

// Stage is a set of calls made in parallel; an endpoint's stages run one after another.
type Stage []Call

// Endpoint is one operation of a service.
type Endpoint struct {
	Name          string
	Compute       time.Duration
	Mode          ComputeMode
	ResponseBytes int
	Stages        []Stage
}

// Service is one microservice (one process, one pod).
type Service struct {
	Name      string
	Protocol  Protocol
	Role      string // "" (a service) or "db" (a database/cache stand-in); informational
	Endpoints map[string]*Endpoint
	Order     []string // endpoint names in file order
}

// Query is a named entry point the load generator drives.
type Query struct {
	Name     string
	Service  string
	Endpoint string
}

// Topology is a whole application.
type Topology struct {
	Name     string
	Services map[string]*Service
	Order    []string // service names in file order
	Queries  map[string]Query
	QOrder   []string
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$`)

// ---- raw YAML shapes -------------------------------------------------------------------------

type rawDefaults struct {
	Protocol      string  `yaml:"protocol"`
	ComputeUS     float64 `yaml:"compute_us"`
	Compute       string  `yaml:"compute"`
	RequestBytes  int     `yaml:"request_bytes"`
	ResponseBytes int     `yaml:"response_bytes"`
}

type rawCall struct {
	Call         string `yaml:"call"`
	RequestBytes *int   `yaml:"request_bytes"`
}

// rawStage accepts a list of calls (parallel) or a single call mapping.
type rawStage []rawCall

func (s *rawStage) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.MappingNode {
		var c rawCall
		if err := n.Decode(&c); err != nil {
			return err
		}
		*s = rawStage{c}
		return nil
	}
	var cs []rawCall
	if err := n.Decode(&cs); err != nil {
		return err
	}
	*s = cs
	return nil
}

type rawEndpoint struct {
	ComputeUS     *float64   `yaml:"compute_us"`
	Compute       string     `yaml:"compute"`
	ResponseBytes *int       `yaml:"response_bytes"`
	Stages        []rawStage `yaml:"stages"`
}

type rawService struct {
	Protocol  string    `yaml:"protocol"`
	Role      string    `yaml:"role"`
	Endpoints yaml.Node `yaml:"endpoints"`
}

type rawQuery struct {
	Service  string `yaml:"service"`
	Endpoint string `yaml:"endpoint"`
}

type rawTopology struct {
	Name        string      `yaml:"name"`
	Description string      `yaml:"description"`
	Defaults    rawDefaults `yaml:"defaults"`
	Queries     yaml.Node   `yaml:"queries"`
	Services    yaml.Node   `yaml:"services"`
}

// Load reads and validates a topology file.
func Load(path string) (*Topology, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	t, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// mapping decodes a YAML mapping node keeping key order.
func mapping[T any](n *yaml.Node, what string) ([]string, map[string]T, error) {
	keys := []string{}
	out := map[string]T{}
	if n.Kind == 0 {
		return keys, out, nil
	}
	if n.Kind != yaml.MappingNode {
		return nil, nil, fmt.Errorf("%s: expected a mapping", what)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i].Value
		var v T
		if err := n.Content[i+1].Decode(&v); err != nil {
			return nil, nil, fmt.Errorf("%s.%s: %w", what, k, err)
		}
		if _, dup := out[k]; dup {
			return nil, nil, fmt.Errorf("%s.%s: defined twice", what, k)
		}
		keys = append(keys, k)
		out[k] = v
	}
	return keys, out, nil
}

var allowed = map[string][]string{
	"":         {"name", "description", "defaults", "queries", "services"},
	"defaults": {"protocol", "compute_us", "compute", "request_bytes", "response_bytes"},
	"query":    {"service", "endpoint"},
	"service":  {"protocol", "role", "endpoints"},
	"endpoint": {"compute_us", "compute", "response_bytes", "stages"},
	"call":     {"call", "request_bytes"},
}

func checkMap(n *yaml.Node, kind, where string, bad func(string, ...any)) {
	if n == nil || n.Kind != yaml.MappingNode {
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i].Value
		ok := false
		for _, a := range allowed[kind] {
			ok = ok || a == k
		}
		if !ok {
			bad("%s%s: unknown field (allowed: %s)", where, k, strings.Join(allowed[kind], ", "))
		}
	}
}

func child(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

func each(n *yaml.Node, f func(k string, v *yaml.Node)) {
	if n == nil || n.Kind != yaml.MappingNode {
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		f(n.Content[i].Value, n.Content[i+1])
	}
}

func checkKeys(root *yaml.Node, _ string, bad func(string, ...any)) {
	checkMap(root, "", "", bad)
	checkMap(child(root, "defaults"), "defaults", "defaults.", bad)
	each(child(root, "queries"), func(q string, v *yaml.Node) { checkMap(v, "query", "queries."+q+".", bad) })
	each(child(root, "services"), func(s string, v *yaml.Node) {
		checkMap(v, "service", "services."+s+".", bad)
		each(child(v, "endpoints"), func(e string, ev *yaml.Node) {
			w := "services." + s + ".endpoints." + e
			checkMap(ev, "endpoint", w+".", bad)
			st := child(ev, "stages")
			if st == nil || st.Kind != yaml.SequenceNode {
				return
			}
			for si, stage := range st.Content {
				calls := []*yaml.Node{stage}
				if stage.Kind == yaml.SequenceNode {
					calls = stage.Content
				}
				for ci, c := range calls {
					checkMap(c, "call", fmt.Sprintf("%s.stages[%d][%d].", w, si, ci), bad)
				}
			}
		})
	})
}

// Parse reads a topology from YAML bytes; all problems are reported at once.
func Parse(b []byte) (*Topology, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, err
	}
	if len(doc.Content) == 0 {
		return nil, fmt.Errorf("empty topology")
	}
	var problems []string
	bad := func(f string, a ...any) { problems = append(problems, fmt.Sprintf(f, a...)) }
	// yaml.v3 checks known fields only at the top level of a decode, not in nested
	// Node.Decode calls: check every level here so a typo (compute_ms) is an error
	checkKeys(doc.Content[0], "", bad)
	var raw rawTopology
	if err := doc.Content[0].Decode(&raw); err != nil {
		return nil, err
	}

	d := raw.Defaults
	if d.Protocol == "" {
		d.Protocol = string(GRPC)
	}
	if d.Compute == "" {
		d.Compute = string(Spin)
	}
	t := &Topology{Name: raw.Name, Services: map[string]*Service{}, Queries: map[string]Query{}}
	if t.Name == "" {
		bad("name: missing")
	}
	sOrder, rawSvcs, err := mapping[rawService](&raw.Services, "services")
	if err != nil {
		return nil, err
	}
	if len(sOrder) == 0 {
		bad("services: none defined")
	}
	type pending struct {
		where string
		c     *Call
		raw   string
	}
	var calls []pending
	for _, sn := range sOrder {
		rs := rawSvcs[sn]
		if !nameRE.MatchString(sn) {
			bad("services.%s: bad name (use [A-Za-z0-9_-])", sn)
		}
		p := rs.Protocol
		if p == "" {
			p = d.Protocol
		}
		if p != string(HTTP) && p != string(GRPC) {
			bad("services.%s.protocol: %q is not http or grpc", sn, p)
		}
		if rs.Role != "" && rs.Role != "db" {
			bad("services.%s.role: %q is not db", sn, rs.Role)
		}
		svc := &Service{Name: sn, Protocol: Protocol(p), Role: rs.Role, Endpoints: map[string]*Endpoint{}}
		eOrder, rawEps, err := mapping[rawEndpoint](&rs.Endpoints, "services."+sn+".endpoints")
		if err != nil {
			return nil, err
		}
		if len(eOrder) == 0 {
			bad("services.%s.endpoints: none defined", sn)
		}
		for _, en := range eOrder {
			re := rawEps[en]
			where := "services." + sn + ".endpoints." + en
			if !nameRE.MatchString(en) {
				bad("%s: bad endpoint name (use [A-Za-z0-9_-])", where)
			}
			us := d.ComputeUS
			if re.ComputeUS != nil {
				us = *re.ComputeUS
			}
			if us < 0 {
				bad("%s.compute_us: negative", where)
			}
			mode := re.Compute
			if mode == "" {
				mode = d.Compute
			}
			if mode != string(Spin) && mode != string(Sleep) {
				bad("%s.compute: %q is not spin or sleep", where, mode)
			}
			rb := d.ResponseBytes
			if re.ResponseBytes != nil {
				rb = *re.ResponseBytes
			}
			if rb < 0 {
				bad("%s.response_bytes: negative", where)
			}
			ep := &Endpoint{Name: en, Compute: time.Duration(us * float64(time.Microsecond)), Mode: ComputeMode(mode), ResponseBytes: rb}
			for si, rst := range re.Stages {
				if len(rst) == 0 {
					bad("%s.stages[%d]: empty stage", where, si)
				}
				st := make(Stage, len(rst))
				for ci, rc := range rst {
					req := d.RequestBytes
					if rc.RequestBytes != nil {
						req = *rc.RequestBytes
					}
					if req < 0 {
						bad("%s.stages[%d][%d].request_bytes: negative", where, si, ci)
					}
					st[ci] = Call{RequestBytes: req}
					// st's backing array never moves: the pointer stays valid
					calls = append(calls, pending{fmt.Sprintf("%s.stages[%d][%d]", where, si, ci), &st[ci], rc.Call})
				}
				ep.Stages = append(ep.Stages, st)
			}
			svc.Endpoints[en] = ep
			svc.Order = append(svc.Order, en)
		}
		t.Services[sn] = svc
		t.Order = append(t.Order, sn)
	}
	for _, pc := range calls {
		s, e, ok := strings.Cut(pc.raw, ".")
		if !ok {
			bad("%s.call: %q is not <service>.<endpoint>", pc.where, pc.raw)
			continue
		}
		pc.c.Service, pc.c.Endpoint = s, e
		if svc := t.Services[s]; svc == nil {
			bad("%s.call: no service %q", pc.where, s)
		} else if svc.Endpoints[e] == nil {
			bad("%s.call: service %q has no endpoint %q", pc.where, s, e)
		}
	}
	qOrder, rawQs, err := mapping[rawQuery](&raw.Queries, "queries")
	if err != nil {
		return nil, err
	}
	for _, qn := range qOrder {
		rq := rawQs[qn]
		t.Queries[qn] = Query{Name: qn, Service: rq.Service, Endpoint: rq.Endpoint}
		t.QOrder = append(t.QOrder, qn)
		if svc := t.Services[rq.Service]; svc == nil {
			bad("queries.%s: no service %q", qn, rq.Service)
		} else if svc.Endpoints[rq.Endpoint] == nil {
			bad("queries.%s: service %q has no endpoint %q", qn, rq.Service, rq.Endpoint)
		}
	}
	if len(problems) == 0 {
		if cyc := t.cycle(); cyc != "" {
			bad("call cycle: %s", cyc)
		}
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("%d problem(s):\n  %s", len(problems), strings.Join(problems, "\n  "))
	}
	return t, nil
}

// cycle returns a description of a call cycle between endpoints, or "".
func (t *Topology) cycle() string {
	const (
		white = 0
		grey  = 1
		black = 2
	)
	color := map[string]int{}
	var path []string
	var visit func(s, e string) string
	visit = func(s, e string) string {
		k := s + "." + e
		switch color[k] {
		case grey:
			return strings.Join(append(path, k), " -> ")
		case black:
			return ""
		}
		color[k] = grey
		path = append(path, k)
		for _, st := range t.Services[s].Endpoints[e].Stages {
			for _, c := range st {
				if r := visit(c.Service, c.Endpoint); r != "" {
					return r
				}
			}
		}
		path = path[:len(path)-1]
		color[k] = black
		return ""
	}
	for _, sn := range t.Order {
		for _, en := range t.Services[sn].Order {
			if r := visit(sn, en); r != "" {
				return r
			}
		}
	}
	return ""
}

// Reachable lists the services a call to service.endpoint touches (itself included), sorted.
func (t *Topology) Reachable(service, endpoint string) []string {
	seen := map[string]bool{}
	var walk func(s, e string)
	walk = func(s, e string) {
		seen[s] = true
		for _, st := range t.Services[s].Endpoints[e].Stages {
			for _, c := range st {
				walk(c.Service, c.Endpoint)
			}
		}
	}
	walk(service, endpoint)
	out := make([]string, 0, len(seen))
	for s := range seen {
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}
