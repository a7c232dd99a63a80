package admin

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"handoff.dev/handoff/internal/budget"
	"handoff.dev/handoff/internal/dispatch"
	"handoff.dev/handoff/internal/journal"
	"handoff.dev/handoff/internal/telemetry"
)

func TestStatusOf(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	rabbit := Source{Name: "orders", Broker: "rabbitmq", From: "orders",
		Tiers: []Tier{{Name: "orders.retry.1s", Delay: time.Second}, {Name: "orders.retry.1m", Delay: time.Minute}}}
	healthy := dispatch.Status{InFlight: 3, Limit: 12, Max: 16, Queued: 2, Budget: &budget.BudgetState{Tokens: 7.5, Denied: 4},
		Routes: []dispatch.RouteStatus{{Name: "orders", InFlight: 3, Oldest: now.Add(-1500 * time.Millisecond)}}}
	with := func(f func(*dispatch.Status)) dispatch.Status {
		st := healthy
		st.Routes = append([]dispatch.RouteStatus(nil), healthy.Routes...)
		f(&st)
		return st
	}
	tests := []struct {
		name       string
		engine     dispatch.Status
		notConn    error
		waiting    []int64
		state      string
		reason     string // a piece of it; "" for none
		tierKnown  bool
		overloaded bool
	}{
		{name: "consuming", engine: healthy, waiting: []int64{4, 0}, state: "consuming", tierKnown: true},
		{name: "tiers not known", engine: healthy, state: "consuming"},
		{name: "not connected", engine: healthy, notConn: errors.New("broker not connected"), state: "paused", reason: "not connected: broker not connected"},
		{name: "app unreachable", engine: with(func(s *dispatch.Status) { s.AppUnreachable = true }), state: "paused", reason: "app unreachable"},
		{name: "Retry-After", engine: with(func(s *dispatch.Status) { s.OverloadUntil = now.Add(30 * time.Second) }), state: "paused", reason: "Retry-After", overloaded: true},
		{name: "fresh intake paused", engine: with(func(s *dispatch.Status) { s.FreshIntakePaused = true }), state: "paused", reason: "fresh intake paused"},
		{name: "journal full", engine: with(func(s *dispatch.Status) { s.JournalFull = true }), state: "paused", reason: "journal full"},
		{name: "retries held", engine: with(func(s *dispatch.Status) { s.Routes[0].RetriesHeld = true }), state: "consuming", reason: "retries held"},
		{name: "the broker first", engine: with(func(s *dispatch.Status) { s.AppUnreachable = true }), notConn: errors.New("down"), state: "paused", reason: "not connected"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := reading{now: now, started: now.Add(-time.Hour), engine: tt.engine,
				sources: []sourceReading{{src: rabbit, notConnected: tt.notConn, waiting: tt.waiting}},
				journal: journal.Stats{Path: "/var/lib/handoff.db", Size: 65536, Open: 3,
					Commits: journal.CommitLatency{P50: time.Millisecond, Max: 4 * time.Millisecond, N: 10}}}
			st := statusOf(r)
			src := st.GetSources()[0]
			if src.GetState() != tt.state {
				t.Errorf("state %q, want %q", src.GetState(), tt.state)
			}
			if tt.reason == "" && src.GetReason() != "" || !strings.Contains(src.GetReason(), tt.reason) {
				t.Errorf("reason %q, want %q", src.GetReason(), tt.reason)
			}
			if src.GetConnected() != (tt.notConn == nil) {
				t.Errorf("connected %v", src.GetConnected())
			}
			if src.GetName() != "orders" || src.GetBroker() != "rabbitmq" || src.GetFrom() != "orders" || src.GetInFlight() != 3 {
				t.Errorf("source %v", src)
			}
			if got := src.GetOldestUnsettledAge().AsDuration(); got != 1500*time.Millisecond {
				t.Errorf("oldest age %v, want 1.5s", got)
			}
			tiers := src.GetRetryTiers()
			if len(tiers) != 2 || tiers[1].GetName() != "orders.retry.1m" || tiers[1].GetDelay().AsDuration() != time.Minute {
				t.Fatalf("tiers %v", tiers)
			}
			if tiers[0].GetKnown() != tt.tierKnown || (tt.tierKnown && tiers[0].GetWaiting() != 4) {
				t.Errorf("tier 0: %v, known want %v", tiers[0], tt.tierKnown)
			}
			c := st.GetCalls()
			if c.GetInFlight() != 3 || c.GetLimit() != 12 || c.GetMax() != 16 || c.GetQueued() != 2 ||
				c.GetAppUnreachable() != tt.engine.AppUnreachable || c.GetFreshIntakePaused() != tt.engine.FreshIntakePaused ||
				(c.GetOverloadUntil() != nil) != tt.overloaded {
				t.Errorf("calls %v", c)
			}
			if b := st.GetBudget(); b.GetTokens() != 7.5 || b.GetDenied() != 4 {
				t.Errorf("budget %v", b)
			}
			j := st.GetJournal()
			if j.GetPath() != "/var/lib/handoff.db" || j.GetSizeBytes() != 65536 || j.GetOpen() != 3 ||
				j.GetCommitP50().AsDuration() != time.Millisecond || j.GetCommitMax().AsDuration() != 4*time.Millisecond {
				t.Errorf("journal %v", j)
			}
			if !st.GetStartedAt().AsTime().Equal(now.Add(-time.Hour)) || st.GetNotReady() != "" {
				t.Errorf("started %v, not ready %q", st.GetStartedAt(), st.GetNotReady())
			}
		})
	}
}

// A source with nothing in flight has no oldest age; a reason quoting a
// URL does not carry its password.
func TestStatusOfIdleAndRedacted(t *testing.T) {
	now := time.Now()
	r := reading{now: now, engine: dispatch.Status{Routes: []dispatch.RouteStatus{{Name: "a"}}},
		notReady: errors.New("source a: dial amqp://user:hunter2@rabbit:5672/: refused"),
		sources:  []sourceReading{{src: Source{Name: "a"}, notConnected: errors.New("dial amqp://user:hunter2@rabbit:5672/: refused")}}}
	st := statusOf(r)
	src := st.GetSources()[0]
	if src.GetOldestUnsettledAge() != nil || src.GetInFlight() != 0 {
		t.Errorf("idle source: %v", src)
	}
	for _, s := range []string{src.GetReason(), st.GetNotReady()} {
		if strings.Contains(s, "hunter2") || s == "" {
			t.Errorf("%q: want a reason without the password", s)
		}
	}
}

// A source's backlog estimate shows with its drain time, or as not
// converging when arrivals outpace completions.
func TestStatusOfBacklog(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tt := range []struct {
		name       string
		est        telemetry.Estimate
		converging bool
		drain      time.Duration
	}{
		{"draining", telemetry.Estimate{Backlog: 1.2e6, Arrival: 8000, Completion: 10000, Drain: 600}, true, 10 * time.Minute},
		{"not converging", telemetry.Estimate{Backlog: 1.2e6, Arrival: 8000, Completion: 7000, Drain: math.Inf(1)}, false, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			src := Source{Name: "orders", Broker: "kafka", From: "orders",
				Backlog: func() (telemetry.Estimate, bool) { return tt.est, true }}
			st := statusOf(reading{now: now, engine: dispatch.Status{Routes: []dispatch.RouteStatus{{Name: "orders"}}},
				sources: []sourceReading{{src: src}}})
			b := st.GetSources()[0].GetBacklog()
			if b.GetMessages() != 1200000 || b.GetArrivalRate() != 8000 || b.GetConverging() != tt.converging ||
				b.GetDrain().AsDuration() != tt.drain {
				t.Fatalf("backlog %v", b)
			}
		})
	}
	src := Source{Name: "orders", Backlog: func() (telemetry.Estimate, bool) { return telemetry.Estimate{}, false }}
	st := statusOf(reading{now: now, sources: []sourceReading{{src: src}}})
	if st.GetSources()[0].GetBacklog() != nil {
		t.Fatal("a backlog shown before there is an estimate")
	}
}

// A source consuming through a Kafka share group says the group's limit
// and lock, where they were read, and its retry readers' group.
func TestStatusOfShareGroup(t *testing.T) {
	src := Source{Name: "orders", Broker: "kafka", From: "orders", Share: func() ShareGroup {
		return ShareGroup{Name: "workers", RetryGroup: "workers.retries", Limit: 5, Lock: 30 * time.Second, ReadFrom: "brokers"}
	}}
	st := statusOf(reading{now: time.Now(), engine: dispatch.Status{Routes: []dispatch.RouteStatus{{Name: "orders"}}},
		sources: []sourceReading{{src: src}}})
	g := st.GetSources()[0].GetShareGroup()
	if g.GetName() != "workers" || g.GetRetryGroup() != "workers.retries" || g.GetDeliveryCountLimit() != 5 ||
		g.GetLockDuration().AsDuration() != 30*time.Second || g.GetReadFrom() != "brokers" {
		t.Fatalf("share group %v", g)
	}
	plain := statusOf(reading{now: time.Now(), sources: []sourceReading{{src: Source{Name: "q", Broker: "rabbitmq"}}}})
	if plain.GetSources()[0].GetShareGroup() != nil {
		t.Fatal("a queue's status names a share group")
	}
}
