package kafka

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/broker/brokertest"
	"handoff.dev/handoff/internal/testkit"
)

// These tests run the adapter against kfake, franz-go's in-process Kafka
// that speaks the real protocol over TCP.

func TestWatermarkOnlyMovesOverSettledRecords(t *testing.T) {
	var w watermark
	for o := int64(10); o < 15; o++ {
		w.track(o, 0)
	}
	steps := []struct {
		settle int64
		want   int64
		moved  bool
	}{
		{12, 10, false}, // a later success never commits past an earlier record
		{11, 10, false},
		{10, 13, true},
		{14, 13, false},
		{13, 15, true},
	}
	for _, s := range steps {
		next, _, moved := w.settle(s.settle)
		if next != s.want || moved != s.moved {
			t.Fatalf("settle(%d) = %d, %v; want %d, %v", s.settle, next, moved, s.want, s.moved)
		}
	}
	if len(w.pending) != 0 {
		t.Errorf("%d records still tracked after settling all", len(w.pending))
	}
}

// Offsets with gaps (compaction, transaction markers), settled in any order:
// the watermark is always just past the settled run at the front.
func TestWatermarkSettlesInAnyOrder(t *testing.T) {
	var w watermark
	var offsets []int64
	for o := int64(100); len(offsets) < 500; o += 1 + int64(len(offsets)%3) {
		w.track(o, 0)
		offsets = append(offsets, o)
	}
	order := rand.New(rand.NewPCG(1, 2)).Perm(len(offsets))
	settled := map[int64]bool{}
	for _, i := range order {
		next, _, _ := w.settle(offsets[i])
		settled[offsets[i]] = true
		want := offsets[0]
		for _, o := range offsets {
			if !settled[o] {
				break
			}
			want = o + 1
		}
		if next != want {
			t.Fatalf("after settling %d: watermark %d, want %d", offsets[i], next, want)
		}
	}
}

func TestWatermarkPeekCountsRecordsAsSettledWithoutSettlingThem(t *testing.T) {
	var w watermark
	if _, _, ok := w.peek(nil); ok {
		t.Fatal("peek before any record is tracked reports an offset")
	}
	for o := int64(10); o < 14; o++ {
		w.track(o, 3)
	}
	w.settle(11)
	if next, epoch, ok := w.peek(map[int64]bool{10: true}); next != 12 || epoch != 3 || !ok {
		t.Errorf("peek with 10 settled = %d, %d, %v; want 12, 3, true", next, epoch, ok)
	}
	if next, _, _ := w.peek(map[int64]bool{12: true}); next != 10 {
		t.Errorf("peek with 12 settled = %d, want 10: record 10 is still open", next)
	}
	if next, _, _ := w.peek(nil); next != 10 {
		t.Errorf("peek changed the watermark: %d, want 10", next)
	}
}

func cluster(t *testing.T, topics ...string) []string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topics...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

func newClient(t *testing.T, addrs []string, topic string, tiers ...time.Duration) *Client {
	t.Helper()
	return newClientWith(t, Options{Brokers: addrs, Topic: topic, Tiers: tiers})
}

func newClientWith(t *testing.T, o Options) *Client {
	t.Helper()
	o.Name, o.Declare = "test", true
	if o.Group == "" {
		o.Group = "g"
	}
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Declare(context.Background()); err != nil {
		t.Fatal(err)
	}
	return c
}

func produce(t *testing.T, addrs []string, recs ...*kgo.Record) {
	t.Helper()
	brokertest.Produce(t, addrs, recs...)
}

func committed(t *testing.T, addrs []string, topic string) int64 {
	t.Helper()
	return committedOf(t, addrs, "g", topic)
}

// consume runs c.Consume until n deliveries arrived and returns them; the
// client keeps running until the test ends.
func consume(t *testing.T, c *Client, n int, timeout time.Duration) []broker.Delivery {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var got []broker.Delivery
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.Consume(ctx, func(d broker.Delivery) {
			mu.Lock()
			got = append(got, d)
			mu.Unlock()
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	testkit.Eventually(t, timeout, fmt.Sprintf("%d deliveries", n), func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) >= n
	})
	mu.Lock()
	defer mu.Unlock()
	return append([]broker.Delivery(nil), got...)
}

func TestCommitsOnlyTheContiguousWatermark(t *testing.T) {
	addrs := cluster(t, "orders")
	var recs []*kgo.Record
	for i := range 10 {
		recs = append(recs, &kgo.Record{Topic: "orders", Key: []byte("k"), Value: []byte(fmt.Sprint(i))})
	}
	produce(t, addrs, recs...)
	c := newClient(t, addrs, "orders", time.Second)
	ds := consume(t, c, 10, 10*time.Second)
	for i, d := range ds {
		if i != 3 {
			_ = d.Ack()
		}
	}
	if m := ds[0].Message(); m.Position != "kafka:orders/0/0" || m.Copy || string(m.Key) != "k" {
		t.Errorf("message = %+v", m)
	}
	_ = ds[3].Release() // handed back: holds the commit
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if got := committed(t, addrs, "orders"); got != 3 {
		t.Fatalf("committed offset %d, want 3: record 3 was never settled", got)
	}

	// The next owner starts at the record handed back.
	c2 := newClient(t, addrs, "orders", time.Second)
	ds = consume(t, c2, 7, 10*time.Second)
	if string(ds[0].Message().Body) != "3" {
		t.Errorf("next owner starts at %q, want record 3", ds[0].Message().Body)
	}
	for _, d := range ds {
		_ = d.Ack()
	}
	if err := c2.Close(); err != nil {
		t.Fatal(err)
	}
	if got := committed(t, addrs, "orders"); got != 10 {
		t.Fatalf("committed offset %d after settling all, want 10 (the log end)", got)
	}
}

// A transactional transfer commits its record's offset with the copy; the
// watermark still never passes a record that is not settled.
func TestTransactionalTransferCommitsWithTheCopy(t *testing.T) {
	addrs := cluster(t, "orders", DeadLetterTopic("orders", "g"))
	var recs []*kgo.Record
	for i := range 6 {
		recs = append(recs, &kgo.Record{Topic: "orders", Value: []byte(fmt.Sprint(i))})
	}
	produce(t, addrs, recs...)
	c := newClientWith(t, Options{Brokers: addrs, Topic: "orders", TransactionalID: "test-txn"})
	ds := consume(t, c, 6, 10*time.Second)
	for _, d := range ds[:2] {
		_ = d.Ack()
	}
	trail := broker.Headers{broker.HeaderEventID: "e-2", broker.HeaderHops: "1"}
	if err := c.Transfer(context.Background(), broker.Destination{DeadLetter: true}, ds[2].Message(), trail); err != nil {
		t.Fatal(err)
	}
	// Committed before the ack: the copy's transaction carried the offset.
	if got := committed(t, addrs, "orders"); got != 3 {
		t.Errorf("committed offset %d after the transfer, want 3", got)
	}
	_ = ds[2].Ack()
	_ = ds[3].Release() // holds the commit
	_ = ds[4].Ack()
	_ = ds[5].Ack()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if got := committed(t, addrs, "orders"); got != 3 {
		t.Errorf("committed offset %d, want 3: record 3 was never settled", got)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumeTopics(DeadLetterTopic("orders", "g")),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got := cl.PollFetches(ctx).Records()
	if len(got) != 1 || string(got[0].Value) != "2" || !got[0].Attrs.IsTransactional() {
		t.Fatalf("DLQ = %d records (want 1, the copy of record 2, written in a transaction)", len(got))
	}
}

func TestRetryCopyWaitsUntilDue(t *testing.T) {
	addrs := cluster(t, "orders")
	c := newClient(t, addrs, "orders", 500*time.Millisecond)
	defer c.Close()
	due := time.Now().Add(800 * time.Millisecond)
	trail := broker.Trail{EventID: "e-1", Attempt: 1, Hops: 1, FirstAttemptAt: time.Now(), Deadline: time.Now().Add(time.Hour), NextDue: due}
	orig := &kgo.Record{Topic: "orders", Key: []byte("key-1"), Value: []byte("body"), Headers: []kgo.RecordHeader{
		{Key: "x-tenant", Value: []byte("acme")}, {Key: "handoff-attempt", Value: []byte("99")},
	}}
	msg := &broker.Message{Key: orig.Key, Body: orig.Value, Native: orig}
	if err := c.Transfer(context.Background(), broker.Destination{Tier: 500 * time.Millisecond}, msg, trail.Headers()); err != nil {
		t.Fatal(err)
	}
	ds := consume(t, c, 1, 10*time.Second)
	at := time.Now()
	if at.Before(due) {
		t.Errorf("copy delivered %v before it was due", due.Sub(at))
	}
	m := ds[0].Message()
	if !m.Copy || string(m.Key) != "key-1" || string(m.Body) != "body" || m.Headers["x-tenant"] != "acme" {
		t.Errorf("copy = %+v", m)
	}
	if got, err := broker.ParseTrail(m.Headers); err != nil || got.EventID != "e-1" || got.Attempt != 1 {
		t.Errorf("copy trail = %+v, %v (the original's handoff-attempt must be replaced)", got, err)
	}
	_ = ds[0].Ack()
}

func TestDeadLetterTopicKeepsTheRecord(t *testing.T) {
	addrs := cluster(t, "orders")
	c := newClient(t, addrs, "orders", time.Second)
	defer c.Close()
	orig := &kgo.Record{Topic: "orders", Key: []byte("k"), Value: []byte{0, 1, 2}, Headers: []kgo.RecordHeader{{Key: "a", Value: []byte("1")}, {Key: "a", Value: []byte("2")}}}
	msg := &broker.Message{Key: orig.Key, Body: orig.Value, Native: orig}
	trail := broker.Trail{EventID: "e", Attempt: 1, DeadReason: "permanent"}
	if err := c.Transfer(context.Background(), broker.Destination{DeadLetter: true}, msg, trail.Headers()); err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumeTopics(DeadLetterTopic("orders", "g")), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f := cl.PollFetches(ctx)
	recs := f.Records()
	if len(recs) != 1 {
		t.Fatalf("DLQ topic holds %d records: %v", len(recs), f.Errors())
	}
	r := recs[0]
	if string(r.Key) != "k" || string(r.Value) != "\x00\x01\x02" {
		t.Errorf("DLQ record key %q value %q", r.Key, r.Value)
	}
	var as, reason string
	for _, h := range r.Headers {
		switch h.Key {
		case "a":
			as += string(h.Value)
		case broker.HeaderDeadReason:
			reason = string(h.Value)
		}
	}
	if as != "12" || reason != "permanent" {
		t.Errorf("headers: repeated a=%q (want 12, in order), dead reason %q", as, reason)
	}
}

func TestFindCopyReadsTheDestinationBack(t *testing.T) {
	addrs := cluster(t, "orders")
	c := newClient(t, addrs, "orders", time.Second)
	defer c.Close()
	before := time.Now()
	orig := &kgo.Record{Topic: "orders", Key: []byte("k"), Value: []byte("v")}
	msg := &broker.Message{Key: orig.Key, Body: orig.Value, Native: orig}
	trail := broker.Trail{EventID: "e-9", Attempt: 2, Hops: 2, DeadReason: "permanent"}
	dlq := broker.Destination{DeadLetter: true}
	if err := c.Transfer(context.Background(), dlq, msg, trail.Headers()); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		dest  broker.Destination
		trail broker.Trail
		since time.Time
		want  bool
	}{
		{"the copy", dlq, trail, before, true},
		{"another hop", dlq, broker.Trail{EventID: "e-9", Attempt: 2, Hops: 3}, before, false},
		{"another event", dlq, broker.Trail{EventID: "e-8", Attempt: 2, Hops: 2}, before, false},
		{"another replay", dlq, broker.Trail{EventID: "e-9", Attempt: 2, Hops: 2, ReplayID: "r1"}, before, false},
		{"another destination", broker.Destination{Tier: time.Second}, trail, before, false},
		{"written before since", dlq, trail, time.Now().Add(time.Minute), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := c.FindCopy(context.Background(), tt.dest, tt.trail.Headers(), tt.since)
			if err != nil || got != tt.want {
				t.Errorf("FindCopy = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
	// A plain record (no handoff-* headers) in the DLQ must not pass for a
	// copy recorded without its identity: that would settle the source with
	// no copy anywhere.
	produce(t, addrs, &kgo.Record{Topic: DeadLetterTopic("orders", "g"), Value: []byte("plain")})
	if got, err := c.FindCopy(context.Background(), dlq, broker.Headers{}, before); got || err == nil {
		t.Errorf("FindCopy of a copy with no identity = %v, %v; want false and an error", got, err)
	}
}

// While the retry budget is spent the client stops fetching its retry topics;
// the source topic goes on.
func TestHoldRetriesStopsOnlyTheRetryTopics(t *testing.T) {
	rt := RetryTopic("orders", "g", time.Second)
	addrs := cluster(t, "orders", rt)
	c := newClient(t, addrs, "orders", time.Second)
	c.HoldRetries(true)
	produce(t, addrs, &kgo.Record{Topic: rt, Value: []byte("retry")}, &kgo.Record{Topic: "orders", Value: []byte("fresh")})
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var got []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.Consume(ctx, func(d broker.Delivery) {
			mu.Lock()
			got = append(got, string(d.Message().Body))
			mu.Unlock()
			_ = d.Ack()
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	seen := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), got...)
	}
	testkit.Eventually(t, 30*time.Second, "the fresh record", func() bool { return len(seen()) > 0 })
	// A second fresh record, produced once the first came, comes in a later
	// fetch; the retry record, there before either, would have come by
	// then had it not been held.
	produce(t, addrs, &kgo.Record{Topic: "orders", Value: []byte("fresh-2")})
	testkit.Eventually(t, 30*time.Second, "the second fresh record", func() bool { return len(seen()) >= 2 })
	if s := seen(); len(s) != 2 || s[0] != "fresh" || s[1] != "fresh-2" {
		t.Fatalf("with retries held got %q, want only the fresh records", s)
	}
	c.HoldRetries(false)
	testkit.Eventually(t, 30*time.Second, "the retry record after the hold", func() bool { return len(seen()) >= 3 })
	if s := seen(); len(s) != 3 || s[2] != "retry" {
		t.Fatalf("after releasing the hold got %q, want the retry record too", s)
	}
}

// A partition paused until its head record is due is resumed when it is
// revoked: the pause is the client's, and would otherwise outlive the
// assignment and starve the partition should it come back.
func TestRevokedPauseDoesNotOutliveTheAssignment(t *testing.T) {
	rt := RetryTopic("orders", "g", time.Second)
	addrs := cluster(t, "orders", rt)
	c := newClient(t, addrs, "orders", time.Second)
	st := &partition{tp: topicPartition{rt, 0}, lost: make(chan struct{}), out: map[*delivery]struct{}{}}
	c.pauseUntil(st, &kgo.Record{Topic: rt, Partition: 0}, time.Now().Add(time.Hour))
	paused := func() bool { return len(c.cl.PauseFetchPartitions(nil)[rt]) > 0 }
	if !paused() {
		t.Fatal("partition not paused")
	}
	close(st.lost)
	testkit.Eventually(t, 30*time.Second, "the revoked partition resumed", func() bool { return !paused() })
}
