package topology

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestBundledTopologiesLoad(t *testing.T) {
	want := map[string][]string{
		"bookinfo.yaml":          {"productpage"},
		"online-boutique.yaml":   {"index", "browse_product", "view_cart"},
		"hotel-reservation.yaml": {"user", "search", "reservation"},
		"social-network.yaml":    {"compose", "home_timeline"},
		"media.yaml":             {"movie_page", "poster", "compose_review"},
		"search.yaml":            {"results", "recommend"},
		"order-pipeline.yaml":    {"checkout", "receipt"},
	}
	for f, queries := range want {
		topo, err := Load(filepath.Join("..", "..", "topologies", f))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if !reflect.DeepEqual(topo.QOrder, queries) {
			t.Errorf("%s: queries %v, want %v", f, topo.QOrder, queries)
		}
	}
}

func TestBookinfoShape(t *testing.T) {
	topo, err := Load("../../topologies/bookinfo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	prod := topo.Services["product"].Endpoints["product"]
	if len(prod.Stages) != 1 || len(prod.Stages[0]) != 2 {
		t.Fatalf("product: want one stage of two parallel calls, got %+v", prod.Stages)
	}
	got := []string{prod.Stages[0][0].Service, prod.Stages[0][1].Service}
	if !reflect.DeepEqual(got, []string{"reviews", "details"}) {
		t.Errorf("product calls %v", got)
	}
	if r := topo.Reachable("frontend", "productpage"); !reflect.DeepEqual(r, []string{"details", "frontend", "product", "ratings", "reviews"}) {
		t.Errorf("reachable %v", r)
	}
	if topo.Services["frontend"].Endpoints["productpage"].Compute != 150*time.Microsecond {
		t.Errorf("compute %v", topo.Services["frontend"].Endpoints["productpage"].Compute)
	}
}

func TestQueryCallOrders(t *testing.T) {
	chain := func(topo *Topology, s, e string) []string {
		var out []string
		for _, st := range topo.Services[s].Endpoints[e].Stages {
			var names []string
			for _, c := range st {
				names = append(names, c.Service+"."+c.Endpoint)
			}
			out = append(out, strings.Join(names, "|"))
		}
		return out
	}
	ob, err := Load("../../topologies/online-boutique.yaml")
	if err != nil {
		t.Fatal(err)
	}
	hr, err := Load("../../topologies/hotel-reservation.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		topo *Topology
		s, e string
		want []string
	}{
		{ob, "frontend", "index", []string{"currency.GetSupportedCurrencies", "productcatalog.ListProducts", "cart.GetCart", "ad.GetAds"}},
		{ob, "frontend", "product", []string{"productcatalog.GetProduct", "currency.GetSupportedCurrencies", "cart.GetCart", "currency.Convert", "recommendation.ListRecommendations", "ad.GetAds"}},
		{ob, "frontend", "cart", []string{"currency.GetSupportedCurrencies", "cart.GetCart", "recommendation.ListRecommendations", "shipping.GetQuote", "productcatalog.GetProduct", "currency.Convert", "productcatalog.GetProduct", "currency.Convert"}},
		{ob, "recommendation", "ListRecommendations", []string{"productcatalog.ListProducts"}},
		{hr, "frontend", "user", []string{"user.CheckUser"}},
		{hr, "frontend", "hotels", []string{"search.Nearby", "reservation.CheckAvailability", "profile.GetProfiles"}},
		{hr, "search", "Nearby", []string{"geo.Nearby", "rate.GetRates"}},
		{hr, "frontend", "reservation", []string{"user.CheckUser", "reservation.MakeReservation"}},
	}
	for _, c := range cases {
		if got := chain(c.topo, c.s, c.e); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s %s.%s: %v, want %v", c.topo.Name, c.s, c.e, got, c.want)
		}
	}
	if ob.Services["frontend"].Protocol != HTTP || ob.Services["currency"].Protocol != GRPC {
		t.Errorf("OB protocols: frontend %s currency %s", ob.Services["frontend"].Protocol, ob.Services["currency"].Protocol)
	}
}

func TestDefaultsAndOverrides(t *testing.T) {
	topo, err := Parse([]byte(`
name: t
defaults: {compute_us: 7, request_bytes: 11, response_bytes: 13, compute: sleep}
services:
  a:
    protocol: http
    endpoints:
      e:
        stages:
          - {call: b.f}
          - [{call: b.f, request_bytes: 5}, {call: b.f}]
  b:
    endpoints:
      f: {compute_us: 1.5, compute: spin, response_bytes: 0}
`))
	if err != nil {
		t.Fatal(err)
	}
	e := topo.Services["a"].Endpoints["e"]
	if e.Compute != 7*time.Microsecond || e.Mode != Sleep || e.ResponseBytes != 13 {
		t.Errorf("defaults not applied: %+v", e)
	}
	if len(e.Stages) != 2 || len(e.Stages[0]) != 1 || len(e.Stages[1]) != 2 {
		t.Fatalf("stages %+v", e.Stages)
	}
	if e.Stages[0][0].RequestBytes != 11 || e.Stages[1][0].RequestBytes != 5 || e.Stages[1][1].RequestBytes != 11 {
		t.Errorf("request sizes %+v", e.Stages)
	}
	f := topo.Services["b"].Endpoints["f"]
	if f.Compute != 1500*time.Nanosecond || f.Mode != Spin || f.ResponseBytes != 0 {
		t.Errorf("overrides not applied: %+v", f)
	}
	if topo.Services["b"].Protocol != GRPC {
		t.Errorf("default protocol %s", topo.Services["b"].Protocol)
	}
}

func TestErrorsReportedTogether(t *testing.T) {
	_, err := Parse([]byte(`
name: t
queries:
  q: {service: a, endpoint: nope}
services:
  a:
    protocol: smtp
    endpoints:
      e:
        compute: dance
        stages:
          - {call: zz.f}
          - {call: nodot}
          - []
`))
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"6 problem(s)", `"smtp"`, `"dance"`, `no service "zz"`, `"nodot"`, "empty stage", `no endpoint "nope"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

func TestCycleAndUnknownField(t *testing.T) {
	_, err := Parse([]byte(`
name: t
services:
  a: {endpoints: {e: {stages: [{call: b.f}]}}}
  b: {endpoints: {f: {stages: [{call: a.e}]}}}
`))
	if err == nil || !strings.Contains(err.Error(), "cycle: a.e -> b.f -> a.e") {
		t.Errorf("cycle not found: %v", err)
	}
	_, err = Parse([]byte("name: t\nservices:\n  a: {endpoints: {e: {compute_ms: 3}}}\n"))
	if err == nil || !strings.Contains(err.Error(), "compute_ms") {
		t.Errorf("unknown field accepted: %v", err)
	}
}
