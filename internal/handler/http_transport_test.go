package handler

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/budget"
	"handoff.dev/handoff/internal/testkit"
)

func TestDeliverTransportErrors(t *testing.T) {
	tests := []struct {
		name    string
		url     func(t *testing.T) string
		timeout time.Duration
		want    budget.Outcome
		// minLatency is how long the call must at least have waited.
		minLatency time.Duration
	}{
		{
			name: "timeout while the app works",
			url: func(t *testing.T) string {
				srv, _ := recordingApp(t, func(w http.ResponseWriter, r *http.Request) {
					select {
					case <-r.Context().Done():
					case <-time.After(time.Minute):
					}
				})
				return srv.URL
			},
			timeout:    100 * time.Millisecond,
			want:       budget.Unknown,
			minLatency: 100 * time.Millisecond,
		},
		{
			name:    "nothing listening",
			url:     func(t *testing.T) string { return "http://" + testkit.ClosedAddr(t) + "/events" },
			timeout: time.Second,
			want:    budget.Unreachable,
		},
		{
			name: "app closes the connection after reading the request",
			url: func(t *testing.T) string {
				srv, _ := recordingApp(t, func(w http.ResponseWriter, _ *http.Request) {
					conn, _, err := http.NewResponseController(w).Hijack()
					if err != nil {
						t.Errorf("hijack: %v", err)
						return
					}
					_ = conn.Close()
				})
				return srv.URL
			},
			timeout: time.Second,
			want:    budget.Unknown,
		},
		{
			name: "app closes the connection before reading the body",
			url: func(t *testing.T) string {
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
					conn, _, err := http.NewResponseController(w).Hijack()
					if err != nil {
						t.Errorf("hijack: %v", err)
						return
					}
					_ = conn.Close()
				}))
				t.Cleanup(srv.Close)
				return srv.URL
			},
			timeout: time.Second,
			want:    budget.Unknown,
		},
		{
			name: "app breaks off mid status line",
			url: func(t *testing.T) string {
				srv, _ := recordingApp(t, func(w http.ResponseWriter, _ *http.Request) {
					conn, buf, err := http.NewResponseController(w).Hijack()
					if err != nil {
						t.Errorf("hijack: %v", err)
						return
					}
					_, _ = buf.WriteString("HTTP/1.1 20")
					_ = buf.Flush()
					_ = conn.Close()
				})
				return srv.URL
			},
			timeout: time.Second,
			want:    budget.Unknown,
		},
		{
			name: "app answers garbage",
			url: func(t *testing.T) string {
				srv, _ := recordingApp(t, func(w http.ResponseWriter, _ *http.Request) {
					conn, buf, err := http.NewResponseController(w).Hijack()
					if err != nil {
						t.Errorf("hijack: %v", err)
						return
					}
					_, _ = buf.WriteString("SSH-2.0-OpenSSH_9.6\r\n\r\n")
					_ = buf.Flush()
					_ = conn.Close()
				})
				return srv.URL
			},
			timeout: time.Second,
			want:    budget.Unknown,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newClient(t, tt.url(t), 1)
			r := request(&broker.Message{Body: bytes.Repeat([]byte("payload "), 1024)})
			r.Timeout = tt.timeout
			start := time.Now()
			res := h.Deliver(context.Background(), r)
			took := time.Since(start)
			if res.Outcome != tt.want {
				t.Errorf("Outcome = %v, want %v (detail %q)", res.Outcome, tt.want, res.Detail)
			}
			if res.Status != 0 {
				t.Errorf("Status = %d, want 0: there was no response", res.Status)
			}
			if res.Detail == "" {
				t.Error("Detail is empty, want the transport error")
			}
			if res.Latency < tt.minLatency {
				t.Errorf("Latency = %v, want at least %v", res.Latency, tt.minLatency)
			}
			// Far past the timeout, short of the minute the working app
			// would hold a call that ignored it.
			if took > tt.timeout+15*time.Second {
				t.Errorf("Deliver took %v with a timeout of %v", took, tt.timeout)
			}
		})
	}
}

func TestDeliverCallerCancellationStopsWaiting(t *testing.T) {
	release := make(chan struct{})
	srv, _ := recordingApp(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	defer close(release)
	h := newClient(t, srv.URL, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	r := request(&broker.Message{})
	r.Timeout = time.Minute // the call's own timeout, far past the bound below
	start := time.Now()
	res := h.Deliver(ctx, r)
	if took := time.Since(start); took > 15*time.Second {
		t.Errorf("Deliver took %v after its caller gave up at 50ms", took)
	}
	if res.Outcome != budget.Unknown {
		t.Errorf("Outcome = %v, want unknown: the app had the request", res.Outcome)
	}
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Errorf("caller ctx err = %v, want deadline exceeded", ctx.Err())
	}
}

func TestProbe(t *testing.T) {
	tests := []struct {
		name    string
		url     func(t *testing.T) string
		ctx     func() (context.Context, context.CancelFunc)
		wantErr bool
	}{
		{
			name: "app listening",
			url: func(t *testing.T) string {
				srv, _ := recordingApp(t, nil)
				return srv.URL + "/events"
			},
			ctx:     func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) },
			wantErr: false,
		},
		{
			name: "bare listener, no HTTP",
			url: func(t *testing.T) string {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = ln.Close() })
				return "http://" + ln.Addr().String()
			},
			ctx:     func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) },
			wantErr: false,
		},
		{
			name:    "nothing listening",
			url:     func(t *testing.T) string { return "http://" + testkit.ClosedAddr(t) + "/events" },
			ctx:     func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) },
			wantErr: true,
		},
		{
			name: "cancelled context",
			url: func(t *testing.T) string {
				srv, _ := recordingApp(t, nil)
				return srv.URL
			},
			ctx: func() (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				return ctx, cancel
			},
			wantErr: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newClient(t, tt.url(t), 1)
			ctx, cancel := tt.ctx()
			defer cancel()
			err := h.Probe(ctx)
			if (err != nil) != tt.wantErr {
				t.Errorf("Probe() = %v, want error: %v", err, tt.wantErr)
			}
		})
	}
}

// TestDeliverReusesPooledConnections holds every round of n calls at the app
// until all n have arrived, so each round needs n connections at once. With
// keep-alive and a pool sized to n, later rounds reuse the first round's
// connections; a smaller pool would dial new ones every round.
func TestDeliverReusesPooledConnections(t *testing.T) {
	tests := []struct {
		name   string
		n      int
		rounds int
	}{
		{"one at a time", 1, 5},
		{"four at once", 4, 6},
		{"sixteen at once", 16, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var (
				mu       sync.Mutex
				arrived  int
				release  = make(chan struct{})
				remotes  = map[string]int{}
				requests int
				dialed   atomic.Int64
			)
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				mu.Lock()
				remotes[r.RemoteAddr]++
				requests++
				arrived++
				wait := release
				if arrived == tt.n {
					close(release)
					release = make(chan struct{})
					arrived = 0
				}
				mu.Unlock()
				select {
				case <-wait:
				case <-time.After(2 * time.Second):
					t.Error("a round never reached its full concurrency")
				}
				_, _ = io.WriteString(w, "ok")
			}))
			srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
				if s == http.StateNew {
					dialed.Add(1)
				}
			}
			srv.Start()
			defer srv.Close()

			h := newClient(t, srv.URL, tt.n)
			for round := range tt.rounds {
				var wg sync.WaitGroup
				results := make([]Result, tt.n)
				for i := range tt.n {
					wg.Go(func() {
						r := request(&broker.Message{Body: []byte("m" + strconv.Itoa(i))})
						r.EventID = "evt-" + strconv.Itoa(round) + "-" + strconv.Itoa(i)
						results[i] = h.Deliver(context.Background(), r)
					})
				}
				wg.Wait()
				for i, res := range results {
					if res.Outcome != budget.Success {
						t.Fatalf("round %d call %d: %+v", round, i, res)
					}
				}
			}

			mu.Lock()
			defer mu.Unlock()
			if want := tt.n * tt.rounds; requests != want {
				t.Errorf("app saw %d requests, want %d", requests, want)
			}
			if len(remotes) != tt.n {
				t.Errorf("app saw %d client addresses over %d rounds, want %d (one per concurrent call): %v", len(remotes), tt.rounds, tt.n, remotes)
			}
			if got := dialed.Load(); got > int64(tt.n) {
				t.Errorf("app accepted %d connections, want at most %d", got, tt.n)
			}
		})
	}
}
