package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	collmetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	colltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/grpc"

	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/testkit"
)

// collector is an OTLP/gRPC collector on loopback that keeps what it is
// sent.
type collector struct {
	collmetrics.UnimplementedMetricsServiceServer
	addr string

	mu      sync.Mutex
	metrics []*collmetrics.ExportMetricsServiceRequest
	spans   []*colltrace.ExportTraceServiceRequest
}

func newCollector(t *testing.T) *collector {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &collector{addr: ln.Addr().String()}
	srv := grpc.NewServer()
	collmetrics.RegisterMetricsServiceServer(srv, c)
	colltrace.RegisterTraceServiceServer(srv, traces{c: c})
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return c
}

func (c *collector) Export(_ context.Context, r *collmetrics.ExportMetricsServiceRequest) (*collmetrics.ExportMetricsServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.metrics = append(c.metrics, r)
	return &collmetrics.ExportMetricsServiceResponse{}, nil
}

// traces receives spans; the trace service's method is also named
// Export, so it is registered through this adapter.
type traces struct {
	colltrace.UnimplementedTraceServiceServer
	c *collector
}

func (t traces) Export(_ context.Context, r *colltrace.ExportTraceServiceRequest) (*colltrace.ExportTraceServiceResponse, error) {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	t.c.spans = append(t.c.spans, r)
	return &colltrace.ExportTraceServiceResponse{}, nil
}

// sum is the latest cumulative value the collector got of a counter's
// points whose attributes include want, and the resource's instance id
// they came with.
func (c *collector) sum(name string, want map[string]string) (float64, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var total float64
	var instance string
	for _, r := range c.metrics {
		for _, rm := range r.GetResourceMetrics() {
			for _, sm := range rm.GetScopeMetrics() {
				for _, m := range sm.GetMetrics() {
					if m.GetName() != name {
						continue
					}
					// Each push is cumulative: the last one holds the total.
					total = 0
					for _, p := range m.GetSum().GetDataPoints() {
						if hasAttrs(p.GetAttributes(), want) {
							total += p.GetAsDouble() + float64(p.GetAsInt())
						}
					}
					instance = attr(rm.GetResource().GetAttributes(), "service.instance.id")
				}
			}
		}
	}
	return total, instance
}

// spanNames are the names of the spans the collector got.
func (c *collector) spanNames() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, r := range c.spans {
		for _, rs := range r.GetResourceSpans() {
			for _, ss := range rs.GetScopeSpans() {
				for _, s := range ss.GetSpans() {
					out = append(out, s.GetName())
				}
			}
		}
	}
	return out
}

func hasAttrs(kvs []*commonpb.KeyValue, want map[string]string) bool {
	for k, v := range want {
		if attr(kvs, k) != v {
			return false
		}
	}
	return true
}

func attr(kvs []*commonpb.KeyValue, key string) string {
	for _, kv := range kvs {
		if kv.GetKey() == key {
			return kv.GetValue().GetStringValue()
		}
	}
	return ""
}

// TestOTLPCollectorGetsMetricsAndSpans: with telemetry.otlp_endpoint set,
// the metrics are pushed there on their interval, named by the replica's
// instance id, and so is a span per attempt.
func TestOTLPCollectorGetsMetricsAndSpans(t *testing.T) {
	t.Parallel()
	conn := dialRabbit(t)
	q := testQueue(t, conn, []time.Duration{time.Second})
	coll := newCollector(t)
	a := newApp(t, status(http.StatusOK))
	cfg := testConfig(a.url(), q, time.Second)
	cfg.Telemetry.OTLPEndpoint = coll.addr
	cfg.Telemetry.OTLPInsecure = true
	cfg.Telemetry.OTLPMetricInterval = config.Duration(time.Second)
	s := startSidecar(t, cfg)
	const n = 3
	var ms []publishing
	for i := range n {
		ms = append(ms, publishing{MessageId: fmt.Sprintf("otlp-%d", i), Body: []byte("x")})
	}
	publish(t, conn, q, ms...)
	testkit.Eventually(t, 20*time.Second, "the outcomes pushed to the collector", func() bool {
		got, _ := coll.sum("handoff.outcomes", map[string]string{"source": "test", "outcome": "success"})
		return got == n
	})
	if _, instance := coll.sum("handoff.outcomes", nil); instance == "" {
		t.Error("the pushed metrics carry no service.instance.id")
	}
	// Spans are batched: the last ones go out when the sidecar stops.
	s.stop(t)
	process := 0
	for _, name := range coll.spanNames() {
		if name == "process "+q {
			process++
		}
	}
	if process != n {
		t.Errorf("the collector got %d process spans, want %d: %v", process, n, coll.spanNames())
	}
}
