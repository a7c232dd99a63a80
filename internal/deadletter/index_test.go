package deadletter

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"handoff.dev/handoff/internal/broker"
)

func TestCatchUpBuildsTheIndex(t *testing.T) {
	f := newFixture(t, false)
	for i := range 6 {
		reason := "max-attempts"
		if i%3 == 0 {
			reason = "permanent"
		}
		f.dlq.add(NoPartition, t0.Add(time.Duration(i)*time.Minute), deadLetter(fmt.Sprint("ev-", i), reason))
	}
	f.ledgerRecord(t, Record{ID: "orders.dlq/1", Transition: Approve, State: Approved, Who: "alice", Why: "fixed"})
	f.ledgerRecord(t, Record{ID: "orders.dlq/0", Transition: Terminate, State: Terminated, Who: "bob", Why: "duplicate"})

	c := f.catchUp(t)
	if c.Letters != 6 || c.Records != 2 || c.Refused != 0 || c.Expired != 0 {
		t.Fatalf("caught %+v", c)
	}
	l := f.get(t, "orders.dlq/1")
	if l.State != Approved || l.EventID != "ev-1" || l.Reason != "max-attempts" || l.Attempts != 5 ||
		l.ErrorClass != "permanent" || l.Error != "amount invalid" || l.Origin != "rabbitmq:orders" ||
		!l.FirstFailureAt.Equal(t0.Add(-time.Hour)) || !l.DeadLetteredAt.Equal(t0.Add(time.Minute)) ||
		l.BodySize != 20 || l.ContentType != "application/json" || len(l.History) != 1 || l.Approval().Who != "alice" {
		t.Fatalf("letter %+v", l)
	}
	counts, err := f.x.Counts("orders")
	if err != nil {
		t.Fatal(err)
	}
	if counts.Open != 5 || counts.ByState[Pending] != 4 || counts.ByState[Approved] != 1 || counts.ByState[Terminated] != 1 ||
		!counts.OldestOpen.Equal(t0.Add(time.Minute)) {
		t.Fatalf("counts %+v", counts)
	}

	tests := []struct {
		name string
		f    Filter
		want []string
	}{
		{name: "all", f: Filter{}, want: []string{"0", "1", "2", "3", "4", "5"}},
		{name: "by source", f: Filter{Source: "other"}, want: nil},
		{name: "by state", f: Filter{States: []State{Pending}}, want: []string{"2", "3", "4", "5"}},
		{name: "by states", f: Filter{States: []State{Approved, Terminated}}, want: []string{"0", "1"}},
		{name: "by reason", f: Filter{Reason: "permanent"}, want: []string{"0", "3"}},
		{name: "by time", f: Filter{Since: t0.Add(2 * time.Minute), Until: t0.Add(4 * time.Minute)}, want: []string{"2", "3"}},
		{name: "after", f: Filter{After: "orders.dlq/3"}, want: []string{"4", "5"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := f.x.List(tt.f)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, l := range p.Letters {
				got = append(got, fmt.Sprint(l.ID.Offset))
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) || p.Next != "" {
				t.Fatalf("got %v next %q; want %v", got, p.Next, tt.want)
			}
		})
	}
}

func TestListPages(t *testing.T) {
	f := newFixture(t, true)
	for i := range 7 {
		f.dlq.add(int32(i%2), t0, deadLetter(fmt.Sprint("ev-", i), "permanent"))
	}
	f.catchUp(t)
	var got []string
	after := ""
	for pages := 0; ; pages++ {
		p, err := f.x.List(Filter{Limit: 3, After: after})
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range p.Letters {
			got = append(got, l.ID.String())
		}
		if p.Next == "" {
			if pages != 2 {
				t.Fatalf("%d pages", pages+1)
			}
			break
		}
		after = p.Next
	}
	want := "[orders.billing.dlq/0/0 orders.billing.dlq/0/1 orders.billing.dlq/0/2 orders.billing.dlq/0/3 orders.billing.dlq/1/0 orders.billing.dlq/1/1 orders.billing.dlq/1/2]"
	if fmt.Sprint(got) != want {
		t.Fatalf("got %v", got)
	}
	if _, err := f.x.List(Filter{After: "nonsense"}); !errors.Is(err, ErrBadID) {
		t.Fatalf("bad page token: %v", err)
	}
}

func TestCatchUpResumesFromStoredOffsets(t *testing.T) {
	f := newFixture(t, true)
	path := filepath.Join(t.TempDir(), "idx")
	x := openIndex(t, path)
	f.x = x
	for i := range 3 {
		f.dlq.add(int32(i%2), t0, deadLetter(fmt.Sprint("ev-", i), "permanent"))
	}
	f.ledgerRecord(t, Record{ID: "orders.billing.dlq/0/0", Transition: Approve, State: Approved})
	if c := f.catchUp(t); c.Letters != 3 || c.Records != 1 {
		t.Fatalf("first catch-up %+v", c)
	}
	if err := x.Close(); err != nil {
		t.Fatal(err)
	}
	f.x = openIndex(t, path)
	f.dlq.add(1, t0, deadLetter("ev-3", "permanent"))
	f.ledgerRecord(t, Record{ID: "orders.billing.dlq/0/0", Transition: Replay, State: Replaying, ReplayID: "r1"})
	if c := f.catchUp(t); c.Letters != 1 || c.Records != 1 {
		t.Fatalf("second catch-up read again what it had: %+v", c)
	}
	if c := f.catchUp(t); c != (Caught{}) {
		t.Fatalf("third catch-up found %+v", c)
	}
	if l := f.get(t, "orders.billing.dlq/0/0"); l.State != Replaying || len(l.History) != 2 {
		t.Fatalf("letter %+v", l)
	}
	offs, err := f.x.Offsets("orders.billing.dlq")
	if err != nil || offs[0] != 2 || offs[1] != 2 {
		t.Fatalf("offsets %v %v", offs, err)
	}
}

func TestRetentionExpiresOpenDeadLetters(t *testing.T) {
	f := newFixture(t, false)
	for i := range 5 {
		f.dlq.add(NoPartition, t0.Add(time.Duration(i)*time.Minute), deadLetter(fmt.Sprint("ev-", i), "permanent"))
	}
	f.ledgerRecord(t, Record{ID: "orders.dlq/0", Transition: Terminate, State: Terminated})
	f.ledgerRecord(t, Record{ID: "orders.dlq/1", Transition: Approve, State: Approved})
	f.catchUp(t)

	f.dlq.truncate(NoPartition, 3)
	c := f.catchUp(t)
	if c.Expired != 2 || c.Unseen != 0 {
		t.Fatalf("caught %+v", c)
	}
	for id, want := range map[string]State{"orders.dlq/0": Terminated, "orders.dlq/1": Expired, "orders.dlq/2": Expired, "orders.dlq/3": Pending} {
		if l := f.get(t, id); l.State != want {
			t.Errorf("%s is %s; want %s", id, l.State, want)
		}
	}
	if h := f.get(t, "orders.dlq/1").History; len(h) != 2 || h[1].Transition != Expire || h[1].Who != "retention" {
		t.Fatalf("history %+v", h)
	}
	counts, _ := f.x.Counts("orders")
	if counts.Open != 2 || counts.ByState[Expired] != 2 || !counts.OldestOpen.Equal(t0.Add(3*time.Minute)) {
		t.Fatalf("counts %+v", counts)
	}
	// Expiry is counted once.
	if c := f.catchUp(t); c.Expired != 0 {
		t.Fatalf("expired again: %+v", c)
	}
	// A late record about an expired letter is refused.
	f.ledgerRecord(t, Record{ID: "orders.dlq/2", Transition: Approve, State: Approved})
	if c := f.catchUp(t); c.Refused != 1 {
		t.Fatalf("caught %+v", c)
	}
}

func TestRetentionBeforeIndexing(t *testing.T) {
	f := newFixture(t, false)
	f.dlq.add(NoPartition, t0, deadLetter("ev-0", "permanent"))
	f.catchUp(t)
	for i := 1; i < 6; i++ {
		f.dlq.add(NoPartition, t0, deadLetter(fmt.Sprint("ev-", i), "permanent"))
	}
	f.dlq.truncate(NoPartition, 4)
	c := f.catchUp(t)
	if c.Unseen != 3 || c.Expired != 1 || c.Letters != 2 {
		t.Fatalf("caught %+v", c)
	}
}

func TestLedgerOrderDecides(t *testing.T) {
	f := newFixture(t, false)
	f.dlq.add(NoPartition, t0, deadLetter("ev-0", "permanent"))
	f.dlq.add(NoPartition, t0, deadLetter("ev-1", "permanent"))
	// Two replicas decided on pending at once; the first record wins.
	f.ledgerRecord(t, Record{ID: "orders.dlq/0", Transition: Terminate, State: Terminated, Who: "bob"})
	f.ledgerRecord(t, Record{ID: "orders.dlq/0", Transition: Approve, State: Approved, Who: "alice"})
	// The outcome of a replay raced ahead of its replay record.
	f.ledgerRecord(t, Record{ID: "orders.dlq/1", Transition: Approve, State: Approved})
	f.ledgerRecord(t, Record{ID: "orders.dlq/1", Transition: Complete, State: Done, ReplayID: "r1"})
	f.ledgerRecord(t, Record{ID: "orders.dlq/1", Transition: Replay, State: Replaying, ReplayID: "r1"})
	// Records this reader cannot use are skipped, not fatal.
	f.led.add(NoPartition, t0, &broker.Message{Body: []byte(`{"v":1,"kind":"replay-heartbeat"}`)})
	f.led.add(NoPartition, t0, &broker.Message{Body: []byte(`{"v":9}`)})
	f.led.add(NoPartition, t0, &broker.Message{Body: []byte(`garbage`)})
	f.ledgerRecord(t, Record{ID: "elsewhere.dlq/0", Transition: Terminate, State: Terminated})

	c := f.catchUp(t)
	if c.Records != 4 || c.Refused != 3 || c.Skipped != 2 {
		t.Fatalf("caught %+v", c)
	}
	if l := f.get(t, "orders.dlq/0"); l.State != Terminated || len(l.History) != 1 || l.History[0].Who != "bob" {
		t.Fatalf("letter 0 %+v", l)
	}
	// The late replay record is kept, before the outcome it preceded: the
	// history says who published the copy, and the state stays done.
	l := f.get(t, "orders.dlq/1")
	var order []Transition
	for _, r := range l.History {
		order = append(order, r.Transition)
	}
	if l.State != Done || !slices.Equal(order, []Transition{Approve, Replay, Complete}) {
		t.Fatalf("letter 1 is %s with history %v, want done with approve, replay, complete", l.State, order)
	}
	// A second replay record of the same replay is refused.
	f.ledgerRecord(t, Record{ID: "orders.dlq/1", Transition: Replay, State: Replaying, ReplayID: "r1"})
	if c := f.catchUp(t); c.Refused != 1 || c.Records != 0 {
		t.Fatalf("a second late replay record: caught %+v", c)
	}
}

func TestLedgerAheadOfDLQ(t *testing.T) {
	f := newFixture(t, false)
	f.ledgerRecord(t, Record{ID: "orders.dlq/0", Transition: Approve, State: Approved, Who: "alice"})
	f.catchUp(t)
	if p, _ := f.x.List(Filter{}); len(p.Letters) != 0 {
		t.Fatalf("listed a letter without its DLQ entry: %+v", p.Letters)
	}
	f.dlq.add(NoPartition, t0, deadLetter("ev-0", "permanent"))
	f.catchUp(t)
	if l := f.get(t, "orders.dlq/0"); !l.Seen || l.State != Approved || l.EventID != "ev-0" {
		t.Fatalf("letter %+v", l)
	}
}

func TestApply(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, false)
	f.dlq.add(NoPartition, t0, deadLetter("ev-0", "permanent"))
	f.dlq.add(NoPartition, t0, deadLetter("ev-1", "permanent"))
	id0 := ID{Log: "orders.dlq", Partition: NoPartition, Offset: 0}
	id1 := ID{Log: "orders.dlq", Partition: NoPartition, Offset: 1}

	repair := &Repair{Body: []byte(`{"amount":10}`), ContentType: "application/json", Note: "amount=invalid → amount=10"}
	l, err := f.x.Apply(ctx, f.src, Change{ID: id0, Transition: Approve, Who: "alice", Why: "fixed the app", Repair: repair})
	if err != nil {
		t.Fatal(err)
	}
	if l.State != Approved || string(l.Approval().Repair.Body) != `{"amount":10}` || l.Approval().Who != "alice" {
		t.Fatalf("approved %+v", l)
	}
	for _, c := range []Change{
		{ID: id0, Transition: Replay, Who: "replica-a", ReplayID: "r1"},
		{ID: id0, Transition: FailReplay, Who: "replica-b", ReplayID: "r1", Successor: ID{Log: "orders.dlq", Partition: NoPartition, Offset: 2}},
	} {
		if l, err = f.x.Apply(ctx, f.src, c); err != nil {
			t.Fatalf("%s: %v", c.Transition, err)
		}
	}
	if l.State != FailedReplay || l.History[2].Successor != "orders.dlq/2" {
		t.Fatalf("letter %+v", l)
	}

	appends := f.led.appends
	tests := []struct {
		name string
		c    Change
		want error
	}{
		{name: "closed", c: Change{ID: id0, Transition: Terminate, Who: "bob"}, want: ErrIllegal},
		{name: "replay before approval", c: Change{ID: id1, Transition: Replay, Who: "r", ReplayID: "r2"}, want: ErrIllegal},
		{name: "expire by hand", c: Change{ID: id1, Transition: Expire, Who: "bob"}, want: ErrIllegal},
		{name: "unknown", c: Change{ID: ID{Log: "orders.dlq", Partition: NoPartition, Offset: 99}, Transition: Terminate, Who: "bob"}, want: ErrNotFound},
		{name: "no who", c: Change{ID: id1, Transition: Terminate}, want: ErrBadRecord},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := f.x.Apply(ctx, f.src, tt.c); !errors.Is(err, tt.want) {
				t.Fatalf("Apply = %v; want %v", err, tt.want)
			}
		})
	}
	if f.led.appends != appends {
		t.Fatal("a refused change was written to the ledger")
	}

	// Another replica terminates id1 between this one's decision and its
	// append: the ledger's order decides, and the loser is told.
	f.led.beforeAppend = func() {
		f.led.beforeAppend = nil
		f.ledgerRecord(t, Record{ID: id1.String(), Transition: Terminate, State: Terminated, Who: "bob"})
	}
	if l, err := f.x.Apply(ctx, f.src, Change{ID: id1, Transition: Approve, Who: "alice"}); !errors.Is(err, ErrLost) || l.State != Terminated {
		t.Fatalf("Apply = %+v, %v; want ErrLost", l, err)
	}
}

func TestOpenRebuildsAnotherVersion(t *testing.T) {
	f := newFixture(t, false)
	f.dlq.add(NoPartition, t0, deadLetter("ev-0", "permanent"))
	path := filepath.Join(t.TempDir(), "idx")
	x := openIndex(t, path)
	f.x = x
	f.catchUp(t)
	if err := x.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put([]byte("version"), []byte{0, 0, 0, 0, 0, 0, 0, 99})
	}); err != nil {
		t.Fatal(err)
	}
	_ = x.Close()
	f.x = openIndex(t, path)
	if c := f.catchUp(t); c.Letters != 1 {
		t.Fatalf("not rebuilt: %+v", c)
	}
}
