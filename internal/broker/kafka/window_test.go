package kafka

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker"
)

// TestTakesOnlyWhatItCanHandOut: records beyond MaxInFlight stay buffered in
// the client, which then fetches no more, so memory holds one fetch however
// long the backlog. A consumer that took the whole fetch would hold it and
// the next one at once.
func TestTakesOnlyWhatItCanHandOut(t *testing.T) {
	addrs := cluster(t, "backlog")
	var recs []*kgo.Record
	for i := range 500 {
		recs = append(recs, &kgo.Record{Topic: "backlog", Value: []byte(strconv.Itoa(i))})
	}
	produce(t, addrs, recs...)
	// Closing abandons what is unsettled at once.
	c := newClientWith(t, Options{Brokers: addrs, Topic: "backlog", MaxInFlight: 10, RevokeTimeout: time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	consume(t, c, 10, 10*time.Second)
	// A bounded look while Consume is blocked on the eleventh: it takes
	// nothing more in the meantime.
	time.Sleep(200 * time.Millisecond)
	// Taken from the client: the ten handed out and, at most, the one
	// waiting for a slot.
	if buffered := c.cl.BufferedFetchRecords(); buffered < 500-11 {
		t.Errorf("%d records left buffered in the client, want at least %d: Consume took more than it could hand out", buffered, 500-11)
	}
}

// Records the app has answered, waiting only for their outcome's commit,
// leave the window of MaxInFlight: more are handed out in their place, up to
// answeredFactor windows held in all, and none of them is committed before
// its Ack.
func TestAnsweredRecordsLeaveTheWindowButHoldTheCommit(t *testing.T) {
	addrs := cluster(t, "orders")
	const window, total = 4, 4 * (answeredFactor + 2)
	var recs []*kgo.Record
	for i := range total {
		recs = append(recs, &kgo.Record{Topic: "orders", Value: []byte(strconv.Itoa(i))})
	}
	produce(t, addrs, recs...)
	c := newClientWith(t, Options{Brokers: addrs, Topic: "orders", MaxInFlight: window, RevokeTimeout: time.Millisecond, heldAtLeast: -1})

	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan broker.Delivery, total)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.Consume(ctx, func(d broker.Delivery) { got <- d })
	}()
	defer func() { cancel(); <-done; _ = c.Close() }()

	take := func(n int) []broker.Delivery {
		var ds []broker.Delivery
		for range n {
			select {
			case d := <-got:
				ds = append(ds, d)
			case <-time.After(10 * time.Second):
				t.Fatalf("%d of %d deliveries", len(ds), n)
			}
		}
		return ds
	}
	nothingMore := func(why string) {
		select {
		case d := <-got:
			t.Fatalf("%s, yet %s was handed out", why, d.Message().Position)
		case <-time.After(200 * time.Millisecond):
		}
	}
	var held []broker.Delivery
	for range answeredFactor {
		ds := take(window)
		nothingMore("the window is full of records not answered")
		for _, d := range ds {
			d.(broker.Answered).Answered()
		}
		held = append(held, ds...)
	}
	// answeredFactor windows answered and held: no slot is left, however
	// many are answered.
	nothingMore("every held slot is taken")
	if err := c.cl.CommitMarkedOffsets(ctx); err != nil {
		t.Fatal(err)
	}
	if off := committed(t, addrs, "orders"); off > 0 {
		t.Fatalf("committed offset %d with nothing acked, want none", off)
	}
	for _, d := range held[:window] {
		if err := d.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range take(window) {
		d.(broker.Answered).Answered()
	}
	if err := c.cl.CommitMarkedOffsets(ctx); err != nil {
		t.Fatal(err)
	}
	if off := committed(t, addrs, "orders"); off != window {
		t.Errorf("committed offset %d after the first %d acks, want %d", off, window, window)
	}
	// Released after Answered: its slots come back once, not twice.
	if err := held[window].Release(); err != nil {
		t.Fatal(err)
	}
	take(1)
	nothingMore("one held slot was freed")
}

// memMarks is Marks in memory.
type memMarks struct {
	mu sync.Mutex
	m  map[string]int64
}

func (m *memMarks) Mark(name string) (int64, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.m[name]
	return v, ok, nil
}

func (m *memMarks) SetMarks(_ context.Context, marks map[string]int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, v := range marks {
		m.m[k] = max(m.m[k], v)
	}
	return nil
}

// A record handed out before, and not committed, comes again after a
// restart flagged Redelivered: Kafka has no such flag; the mark written
// before the record was called for says so. The mark runs markAhead past
// the last record handed out (one write per so many records): those records
// come flagged too, and the ones past it do not.
func TestHandedOutMarkFlagsRedeliveries(t *testing.T) {
	addrs := cluster(t, "orders")
	for i := range 5 {
		produce(t, addrs, &kgo.Record{Topic: "orders", Value: []byte(fmt.Sprint(i))})
	}
	marks := &memMarks{m: map[string]int64{}}
	c := newClientWith(t, Options{Brokers: addrs, Topic: "orders", Marks: marks, MaxInFlight: 8})
	ahead := c.markAhead()
	ds := consume(t, c, 5, 10*time.Second)
	for _, d := range ds {
		if d.Message().Redelivered {
			t.Errorf("first delivery of %s says redelivered", d.Message().Body)
		}
	}
	// Called only once the mark is durable: the engine waits for this.
	awaitFences(t, ds)
	if v, _, _ := marks.Mark(c.markName(topicPartition{"orders", 0}, c.partition("orders", 0).topicID)); v != 4+ahead {
		t.Fatalf("mark = %d, want %d (the last offset handed out, and markAhead more)", v, 4+ahead)
	}
	_ = ds[0].Ack()
	_ = ds[1].Ack()
	// Records 2..4 were handed out and never settled, as a crash leaves
	// them.
	for _, d := range ds[2:] {
		_ = d.Release()
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	last := 4 + ahead + 1 // the first offset past the mark
	for i := int64(5); i <= last; i++ {
		produce(t, addrs, &kgo.Record{Topic: "orders", Value: []byte(fmt.Sprint(i))})
	}
	c2 := newClientWith(t, Options{Brokers: addrs, Topic: "orders", Marks: marks, MaxInFlight: 256})
	checkRedeliveredUpTo(t, consume(t, c2, int(last-1), 10*time.Second), 4+ahead)
}

// A partition's mark goes as far past its last record as a second of its
// recent hand-outs, so that a slow commit of the next mark does not hold
// calls back: never less than markAhead, never more than the client holds.
func TestMarkAheadFollowsTheRate(t *testing.T) {
	c := newClientWith(t, Options{Brokers: cluster(t, "orders"), Topic: "orders", MaxInFlight: 100})
	t.Cleanup(func() { _ = c.Close() })
	base, most := c.markAhead(), int64(cap(c.held)+cap(c.sem))
	st := &partition{}
	t0 := time.Unix(1000, 0)
	steps := []struct {
		top  int64
		at   time.Duration
		want int64
	}{
		{0, 0, base},                          // no rate known yet
		{50, time.Second, base},               // 50 a second: less than markAhead
		{550, 2 * time.Second, 500},           // 500 a second
		{650, 2100 * time.Millisecond, 1000},  // 1000 a second
		{5650, 2200 * time.Millisecond, most}, // 50,000 a second: what the client holds
		{5660, 12 * time.Second, base},        // idle since
	}
	for _, s := range steps {
		if got := c.nextAhead(st, s.top, t0.Add(s.at)); got != s.want {
			t.Errorf("mark at offset %d after %v: %d ahead, want %d", s.top, s.at, got, s.want)
		}
	}
}

// Large records answered keep their slots once those held out of the
// window reach maxAnsweredBytes: with large messages the window, not the
// count of answered ones, bounds memory.
func TestAnsweredLargeRecordsKeepTheirSlots(t *testing.T) {
	addrs := cluster(t, "orders")
	const window = 4
	body := bytes.Repeat([]byte("x"), 1000)
	var recs []*kgo.Record
	for range 3 * window {
		recs = append(recs, &kgo.Record{Topic: "orders", Value: body})
	}
	produce(t, addrs, recs...)
	c := newClientWith(t, Options{Brokers: addrs, Topic: "orders", MaxInFlight: window, RevokeTimeout: time.Millisecond})
	c.maxAnswered = 2500 // two such records, not three

	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan broker.Delivery, 3*window)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.Consume(ctx, func(d broker.Delivery) { got <- d })
	}()
	defer func() { cancel(); <-done; _ = c.Close() }()
	take := func(n int) []broker.Delivery {
		var ds []broker.Delivery
		for range n {
			select {
			case d := <-got:
				ds = append(ds, d)
			case <-time.After(10 * time.Second):
				t.Fatalf("%d of %d deliveries", len(ds), n)
			}
		}
		return ds
	}
	for _, d := range take(window) {
		d.(broker.Answered).Answered()
	}
	take(2) // in the places of the two that left the window
	select {
	case d := <-got:
		t.Fatalf("%s handed out with the window full", d.Message().Position)
	case <-time.After(200 * time.Millisecond):
	}
	if got, want := c.answeredBytes.Load(), int64(2*len(body)); got != want {
		t.Errorf("answered bytes held = %d, want %d (two records)", got, want)
	}
}

// A small window (twice the calls in flight, ordering none's default) still
// holds as many answered records out of it as the old default did: a commit
// stalled on the disk lasts as long whatever the window.
func TestAnsweredHeldWhateverTheWindow(t *testing.T) {
	for _, tt := range []struct{ window, want int }{{4, minAnsweredHeld}, {128, minAnsweredHeld}, {512, answeredFactor * 512}} {
		c, err := New(Options{Brokers: []string{"127.0.0.1:1"}, Topic: "orders", Group: "g", MaxInFlight: tt.window})
		if err != nil {
			t.Fatal(err)
		}
		if got := cap(c.held); got != tt.want {
			t.Errorf("window %d: %d answered records held, want %d", tt.window, got, tt.want)
		}
		_ = c.Close()
	}
}
