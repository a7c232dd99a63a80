package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/testkit"
)

// The lag of each retry topic counts the copies written to it that the group
// has not committed past, in tier order.
func TestRetryLag(t *testing.T) {
	addrs := cluster(t, "orders")
	c := newClient(t, addrs, "orders", 500*time.Millisecond, time.Minute)
	defer c.Close()
	ctx := context.Background()
	// The client's view of topics just created (by Declare) takes a while
	// to catch up.
	var lags []TierLag
	testkit.Eventually(t, 15*time.Second, "the retry topics' lag", func() bool {
		var err error
		lags, err = c.RetryLag(ctx)
		return err == nil
	})
	if len(lags) != 2 || lags[0].Lag != 0 || lags[1].Lag != 0 || lags[1].Topic != RetryTopic("orders", "g", time.Minute) {
		t.Fatalf("before any copy: %+v", lags)
	}
	copyTo := func(tier time.Duration, id string) {
		orig := &kgo.Record{Topic: "orders", Value: []byte("body")}
		trail := broker.Trail{EventID: id, Attempt: 1, Hops: 1, FirstAttemptAt: time.Now(), Deadline: time.Now().Add(time.Hour), NextDue: time.Now().Add(tier)}
		if err := c.Transfer(ctx, broker.Destination{Tier: tier}, &broker.Message{Body: orig.Value, Native: orig}, trail.Headers()); err != nil {
			t.Fatal(err)
		}
	}
	copyTo(500*time.Millisecond, "a")
	copyTo(time.Minute, "b")
	copyTo(time.Minute, "c")
	lags, err := c.RetryLag(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if lags[0].Tier != 500*time.Millisecond || lags[0].Lag != 1 || lags[1].Lag != 2 {
		t.Errorf("lags %+v, want 1 and 2", lags)
	}
}

// A group no member has joined yet counts its whole log as lag: kfake
// answers GROUP_ID_NOT_FOUND where Apache Kafka answers with no offsets,
// and neither is an error for a lag.
func TestLagOfAGroupNotYetJoined(t *testing.T) {
	topic := "lag-unjoined"
	addrs := cluster(t, topic)
	produce(t, addrs, &kgo.Record{Topic: topic, Value: []byte("a")}, &kgo.Record{Topic: topic, Value: []byte("b")})
	adm := kadm.NewClient(adminClient(t, addrs))
	committed, err := groupOffsets(context.Background(), adm, "never-joined")
	if err != nil {
		t.Fatalf("offsets of a group not yet joined: %v", err)
	}
	ends, err := adm.ListEndOffsets(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	starts, err := adm.ListStartOffsets(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	end, _ := ends.Lookup(topic, 0)
	if lag := partitionLag(end, committed, starts, -1); lag != 2 {
		t.Errorf("lag = %d, want 2 (the whole log)", lag)
	}
}
