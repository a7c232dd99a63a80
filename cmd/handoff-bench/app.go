package main

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fastjson"
)

// The bench app is a separate process, as the user's app is: it answers each
// POST at once, by a fixed rule on the message id, and counts.

// failure mix: 1% poison (422), 10% transient (500 on the first attempt).
func answer(id string, attempt int, mixed bool) int {
	if !mixed {
		return http.StatusOK
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	switch v := h.Sum32() % 100; {
	case v == 0:
		return http.StatusUnprocessableEntity
	case v <= 10 && attempt <= 1:
		return http.StatusInternalServerError
	}
	return http.StatusOK
}

// appStats is what GET /stats returns.
type appStats struct {
	Calls int64 `json:"calls"`
	// Batches is the batched requests among them: Calls over Batches is
	// how full the sidecar's batches went out.
	Batches   int64 `json:"batches"`
	Successes int64 `json:"successes"`
	Poison    int64 `json:"poison"`
	// FirstNano and LastNano are the first call and the latest success.
	FirstNano int64 `json:"first_nano"`
	LastNano  int64 `json:"last_nano"`
	// P50Micros and P99Micros are the publish → app latencies of messages
	// that carried an X-Sent header (unix nanoseconds).
	P50Micros int64 `json:"p50_us"`
	P99Micros int64 `json:"p99_us"`
	// SlowMillis is, for each second from the first such message on, the
	// slowest of that second's arrivals, in milliseconds: where in a paced
	// run its tail sits.
	SlowMillis []int64 `json:"slow_ms"`
}

func runApp(args []string) error {
	listen := "127.0.0.1:0"
	mixed := false
	for i := 0; i < len(args); i++ {
		switch args[i] {
		case "-listen":
			i++
			listen = args[i]
		case "-mixed":
			mixed = true
		}
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	var (
		latMu    sync.Mutex
		lat      []int64 // microseconds
		arrived  []int64 // unix nanoseconds, lat's arrivals
		st       appStats
		seenMu   sync.Mutex
		seen     = map[string]bool{} // ids answered 2xx, so a duplicate success is not counted twice
		firstSet atomic.Bool
	)
	mux := http.NewServeMux()
	// handle answers one message and counts it.
	handle := func(id string, attempt int) int {
		now := time.Now().UnixNano()
		if firstSet.CompareAndSwap(false, true) {
			atomic.StoreInt64(&st.FirstNano, now)
		}
		atomic.AddInt64(&st.Calls, 1)
		code := answer(id, attempt, mixed)
		switch code {
		case http.StatusOK:
			seenMu.Lock()
			dup := seen[id]
			seen[id] = true
			seenMu.Unlock()
			if !dup {
				atomic.AddInt64(&st.Successes, 1)
				atomic.StoreInt64(&st.LastNano, now)
			}
		case http.StatusUnprocessableEntity:
			seenMu.Lock()
			dup := seen[id]
			seen[id] = true
			seenMu.Unlock()
			if !dup {
				atomic.AddInt64(&st.Poison, 1)
				atomic.StoreInt64(&st.LastNano, now)
			}
		}
		return code
	}
	mux.HandleFunc("/events", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Content-Type") == "application/cloudevents-batch+json" {
			events, err := readBatch(r.Body)
			if err != nil {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
			atomic.AddInt64(&st.Batches, 1)
			out := appendResults(make([]byte, 0, 16+len(events)*64), events, handle)
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(out)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		id := r.Header.Get("Ce-Id")
		if id == "" {
			id = r.Header.Get("X-Id")
		}
		attempt, _ := strconv.Atoi(r.Header.Get("Handoff-Attempt"))
		if sent, err := strconv.ParseInt(r.Header.Get("X-Sent"), 10, 64); err == nil {
			now := time.Now().UnixNano()
			d := (now - sent) / 1000
			latMu.Lock()
			lat = append(lat, d)
			arrived = append(arrived, now)
			latMu.Unlock()
		}
		w.WriteHeader(handle(id, attempt))
	})
	mux.HandleFunc("/stats", func(w http.ResponseWriter, _ *http.Request) {
		latMu.Lock()
		sorted := slices.Clone(lat)
		slow := slowestBySecond(arrived, lat)
		latMu.Unlock()
		slices.Sort(sorted)
		var p50, p99 int64
		if len(sorted) > 0 {
			p50, p99 = sorted[len(sorted)/2], sorted[len(sorted)*99/100]
		}
		_ = json.NewEncoder(w).Encode(appStats{P50Micros: p50, P99Micros: p99, SlowMillis: slow,
			Calls: atomic.LoadInt64(&st.Calls), Batches: atomic.LoadInt64(&st.Batches),
			Successes: atomic.LoadInt64(&st.Successes), Poison: atomic.LoadInt64(&st.Poison),
			FirstNano: atomic.LoadInt64(&st.FirstNano), LastNano: atomic.LoadInt64(&st.LastNano),
		})
	})
	fmt.Fprintf(os.Stdout, "listening %s\n", ln.Addr())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	return srv.Serve(ln)
}

// batchEvent is what the app reads of an event in a batch.
type batchEvent struct {
	id      string
	attempt int
}

var batchParsers fastjson.ParserPool

// readBatch reads a CloudEvents batch: the whole body is parsed and
// validated, as any JSON reader must to find where each event ends, and
// each event's id and handoffattempt kept. It uses a parser as fast as the
// JSON readers most apps' languages have; encoding/json's reflective
// decode, which the single-message rows never pay (their bodies go
// unread), was most of the app's CPU behind the batch rows.
func readBatch(body io.Reader) ([]batchEvent, error) {
	data, err := io.ReadAll(body)
	if err != nil {
		return nil, err
	}
	p := batchParsers.Get()
	defer batchParsers.Put(p)
	v, err := p.ParseBytes(data)
	if err != nil {
		return nil, err
	}
	arr, err := v.Array()
	if err != nil {
		return nil, err
	}
	events := make([]batchEvent, len(arr))
	for i, ev := range arr {
		events[i].id = string(ev.GetStringBytes("id"))
		events[i].attempt, _ = strconv.Atoi(string(ev.GetStringBytes("handoffattempt")))
	}
	return events, nil
}

// appendResults appends the batch answer: each event's status by handle.
func appendResults(out []byte, events []batchEvent, handle func(id string, attempt int) int) []byte {
	out = append(out, `{"results":[`...)
	for i, e := range events {
		if i > 0 {
			out = append(out, ',')
		}
		id, _ := json.Marshal(e.id)
		out = append(out, `{"id":`...)
		out = append(out, id...)
		out = append(out, `,"status":`...)
		out = strconv.AppendInt(out, int64(handle(e.id, e.attempt)), 10)
		out = append(out, '}')
	}
	return append(out, "]}\n"...)
}

// slowestBySecond is, for each second from the first arrival on, the
// slowest latency (µs) of the messages that arrived in it, in milliseconds.
func slowestBySecond(arrived, lat []int64) []int64 {
	var slow []int64
	for i, at := range arrived {
		sec := int((at - arrived[0]) / int64(time.Second))
		for len(slow) <= sec {
			slow = append(slow, 0)
		}
		slow[sec] = max(slow[sec], lat[i]/1000)
	}
	return slow
}
