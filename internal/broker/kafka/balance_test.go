package kafka

import (
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"handoff.dev/handoff/internal/broker/brokertest"
	"handoff.dev/handoff/internal/testkit"
)

func TestBalanceTopicSharesEachTopic(t *testing.T) {
	for _, tc := range []struct {
		name    string
		n       int32
		members []topicClaim
		want    [][]int32
	}{
		{name: "fresh, two", n: 6, members: make([]topicClaim, 2), want: [][]int32{{0, 1, 2}, {3, 4, 5}}},
		{name: "fresh, three", n: 6, members: make([]topicClaim, 3), want: [][]int32{{0, 1}, {2, 3}, {4, 5}}},
		{name: "fresh, uneven", n: 7, members: make([]topicClaim, 3), want: [][]int32{{0, 1, 2}, {3, 4}, {5, 6}}},
		{name: "more members than partitions", n: 2, members: make([]topicClaim, 3), want: [][]int32{{0}, {1}, nil}},
		{
			// The one that held everything keeps half; the newcomer
			// gets the rest.
			name: "one owned all", n: 6,
			members: []topicClaim{{owned: []int32{0, 1, 2, 3, 4, 5}}, {}},
			want:    [][]int32{{0, 1, 2}, {3, 4, 5}},
		},
		{
			name: "sticky where balanced", n: 6,
			members: []topicClaim{{owned: []int32{1, 3, 5}}, {owned: []int32{0, 2, 4}}},
			want:    [][]int32{{1, 3, 5}, {0, 2, 4}},
		},
		{
			// The odd partition goes to the member that owns more.
			name: "uneven keeps the larger owner", n: 5,
			members: []topicClaim{{owned: []int32{4}}, {owned: []int32{0, 1, 2, 3}}},
			want:    [][]int32{{3, 4}, {0, 1, 2}},
		},
		{
			// A member that missed a rebalance still claims what another
			// owns now, at a later generation.
			name: "stale claim", n: 4,
			members: []topicClaim{{owned: []int32{0, 1, 2, 3}, generation: 3}, {owned: []int32{2, 3}, generation: 5}},
			want:    [][]int32{{0, 1}, {2, 3}},
		},
		{
			// The topic was recreated smaller: what is past its end is
			// nobody's.
			name: "claim past the end", n: 2,
			members: []topicClaim{{owned: []int32{0, 1, 5, 7}}, {}},
			want:    [][]int32{{0}, {1}},
		},
		{
			// The extra partition goes to the member given less so far.
			name: "extra to the less loaded", n: 3,
			members: []topicClaim{{load: 2}, {load: 1}},
			want:    [][]int32{{2}, {0, 1}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := balanceTopic(tc.n, tc.members)
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("balanceTopic(%d) = %v, want %v", tc.n, got, tc.want)
			}
			seen := map[int32]bool{}
			for _, ps := range got {
				for _, p := range ps {
					if seen[p] {
						t.Errorf("partition %d assigned twice", p)
					}
					seen[p] = true
				}
			}
			if len(seen) != int(tc.n) {
				t.Errorf("%d of %d partitions assigned", len(seen), tc.n)
			}
		})
	}
}

// joinMember is a member as the coordinator hands it to the leader: its id
// and the metadata its own balancer wrote.
func joinMember(id string, topics []string, owned map[string][]int32, generation int32) kmsg.JoinGroupResponseMember {
	m := kmsg.NewJoinGroupResponseMember()
	m.MemberID = id
	m.ProtocolMetadata = (&perTopicBalancer{}).JoinGroupMetadata(topics, owned, generation)
	return m
}

// planOf balances members over topics and returns member → topic →
// partitions.
func planOf(t *testing.T, topics map[string]int32, members ...kmsg.JoinGroupResponseMember) map[string]map[string][]int32 {
	t.Helper()
	mb, _, err := (&perTopicBalancer{}).MemberBalancer(members)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := mb.(kgo.GroupMemberBalancerOrError).BalanceOrError(topics)
	if err != nil {
		t.Fatal(err)
	}
	return plan.(*kgo.BalancePlan).AsMemberIDMap()
}

// The case seen in the field: one member holds the whole source topic, the
// other only retry partitions. The plan moves half of each topic, and
// cooperatively: what changes hands is first taken away from its owner,
// and assigned in the next round, once revoked.
func TestBalancerEvensEveryTopicCooperatively(t *testing.T) {
	topics := map[string]int32{"src": 6, "src.retry": 6}
	names := []string{"src", "src.retry"}
	a := joinMember("a", names, map[string][]int32{"src": {0, 1, 2, 3, 4, 5}}, 4)
	b := joinMember("b", names, map[string][]int32{"src.retry": {0, 1, 2, 3, 4, 5}}, 4)
	first := planOf(t, topics, a, b)
	want := "map[a:map[src:[0 1 2]] b:map[src.retry:[0 1 2]]]"
	if fmt.Sprint(first) != want {
		t.Fatalf("first round %v, want %v", first, want)
	}
	// Both revoked what they lost and join again owning what they kept.
	a = joinMember("a", names, map[string][]int32{"src": {0, 1, 2}}, 5)
	b = joinMember("b", names, map[string][]int32{"src.retry": {0, 1, 2}}, 5)
	second := planOf(t, topics, a, b)
	want = "map[a:map[src:[0 1 2] src.retry:[3 4 5]] b:map[src:[3 4 5] src.retry:[0 1 2]]]"
	if fmt.Sprint(second) != want {
		t.Errorf("second round %v, want %v", second, want)
	}
}

// A member of an older release offers only cooperative-sticky; one of this
// release offers both, its own first, so the group keeps working while it
// is upgraded one member at a time.
func TestGroupOffersBothBalancers(t *testing.T) {
	t.Parallel()
	var names []string
	for _, b := range groupBalancers(&perTopicBalancer{}) {
		names = append(names, b.ProtocolName())
	}
	if want := []string{perTopicProtocol, "cooperative-sticky"}; !slices.Equal(names, want) {
		t.Errorf("balancers %v, want %v", names, want)
	}
}

// Two, then three, then two and three again sidecars on a topic of six
// partitions with two retry tiers: after every change of the group, each
// member holds its share of every topic — of the source topic above all.
func TestEveryMemberSharesTheSourceTopic(t *testing.T) {
	t.Run("kfake", func(t *testing.T) {
		t.Parallel()
		tiers := []time.Duration{time.Second, 5 * time.Second}
		topics := []string{"orders", RetryTopic("orders", "g", tiers[0]), RetryTopic("orders", "g", tiers[1])}
		addrs := clusterWith(t, 6, topics...)
		testMembersShare(t, addrs, "orders", "g", tiers)
	})
	t.Run("apache", func(t *testing.T) {
		t.Parallel()
		addrs, topic := brokertest.KafkaTopic(t, "share", 6)
		testMembersShare(t, addrs, topic, brokertest.KafkaGroup(topic), []time.Duration{time.Second, 5 * time.Second})
	})
}

func clusterWith(t *testing.T, partitions int32, topics ...string) []string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topics...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

func testMembersShare(t *testing.T, addrs []string, topic, group string, tiers []time.Duration) {
	topics := []string{topic}
	for _, d := range tiers {
		topics = append(topics, RetryTopic(topic, group, d))
	}
	type member struct {
		c *Client
		r *consuming
	}
	var members []*member
	join := func() {
		c := newClientWith(t, Options{Brokers: addrs, Topic: topic, Group: group, Tiers: tiers})
		members = append(members, &member{c: c, r: startConsuming(c, nil)})
	}
	leave := func(i int) {
		m := members[i]
		members = slices.Delete(members, i, i+1)
		m.r.stop()
		_ = m.c.Close()
	}
	t.Cleanup(func() {
		for len(members) > 0 {
			leave(0)
		}
	})
	// shared reports whether every partition of every topic has one owner,
	// and each member holds its share of each topic; else what it sees.
	shared := func() (bool, string) {
		counts := make([]map[string]int, len(members))
		owners := map[topicPartition]int{}
		for i, m := range members {
			counts[i] = map[string]int{}
			m.c.mu.Lock()
			for tp, st := range m.c.parts {
				if !st.gone {
					counts[i][tp.topic]++
					owners[tp]++
				}
			}
			m.c.mu.Unlock()
		}
		var b strings.Builder
		ok := true
		for _, tp := range topics {
			lo, hi := 6/len(members), (6+len(members)-1)/len(members)
			fmt.Fprintf(&b, "%s:", tp)
			for i := range members {
				n := counts[i][tp]
				fmt.Fprintf(&b, " %d", n)
				ok = ok && n >= lo && n <= hi
			}
			for p := range int32(6) {
				ok = ok && owners[topicPartition{tp, p}] == 1
			}
			b.WriteString("; ")
		}
		return ok, b.String()
	}
	settle := func(what string) {
		t.Helper()
		var seen string
		held := 0 // consecutive looks that found it shared: not a plan on its way to another
		defer func() {
			if t.Failed() {
				t.Logf("%s: last seen %s", what, seen)
			}
		}()
		testkit.Eventually(t, 60*time.Second, what+": every topic shared for 300ms", func() bool {
			var ok bool
			if ok, seen = shared(); ok {
				held++
			} else {
				held = 0
			}
			return held >= 30
		})
		t.Logf("%s: %s", what, seen)
	}
	join()
	join()
	settle("two members")
	join()
	settle("three members")
	leave(0)
	settle("the first left")
	join()
	settle("three again")
	leave(2)
	settle("the newest left")
}

// During a rolling upgrade a member of the older release, which offers only
// cooperative-sticky, and one of this release form one group: the
// coordinator picks the protocol both offer, and every partition has one
// owner.
func TestGroupFormsWithAnOlderMember(t *testing.T) {
	t.Parallel()
	addrs, topic := brokertest.KafkaTopic(t, "upgrade", 6)
	group := brokertest.KafkaGroup(topic)
	older := newClientWith(t, Options{Brokers: addrs, Topic: topic, Group: group,
		Extra: []kgo.Opt{kgo.Balancers(kgo.CooperativeStickyBalancer())}})
	newer := newClientWith(t, Options{Brokers: addrs, Topic: topic, Group: group})
	var runs []*consuming
	for _, c := range []*Client{older, newer} {
		runs = append(runs, startConsuming(c, nil))
	}
	t.Cleanup(func() {
		for i, c := range []*Client{older, newer} {
			runs[i].stop()
			_ = c.Close()
		}
	})
	held := func(c *Client) []int32 {
		c.mu.Lock()
		defer c.mu.Unlock()
		var ps []int32
		for tp, st := range c.parts {
			if tp.topic == topic && !st.gone {
				ps = append(ps, tp.partition)
			}
		}
		return ps
	}
	testkit.Eventually(t, 60*time.Second, "both members consuming, every partition once", func() bool {
		a, b := held(older), held(newer)
		all := slices.Sorted(slices.Values(append(slices.Clone(a), b...)))
		return len(a) > 0 && len(b) > 0 && slices.Equal(all, []int32{0, 1, 2, 3, 4, 5})
	})
}

// A static member restarted as the group's leader is handed the previous
// plan (KIP-814) and told not to balance. When that plan no longer fits —
// here it was made while the retry topic did not exist yet, as when a run
// dies before the rebalance that follows its declare — the member
// rebalances, and the retry topic's partitions get their consumer.
func TestRestartedLeaderReplacesAStalePlan(t *testing.T) {
	t.Parallel()
	addrs, topic := brokertest.KafkaTopic(t, "stale", 3)
	group := brokertest.KafkaGroup(topic)
	tier := 300 * time.Millisecond
	rt := RetryTopic(topic, group, tier)
	o := Options{Name: "test", Brokers: addrs, Topic: topic, Group: group, InstanceID: "static-" + topic,
		Tiers: []time.Duration{tier}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	held := func(c *Client) map[string]int {
		c.mu.Lock()
		defer c.mu.Unlock()
		n := map[string]int{}
		for tp, st := range c.parts {
			if !st.gone {
				n[tp.topic]++
			}
		}
		return n
	}
	// The first run balances before its retry topic exists.
	before, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	r := startConsuming(before, nil)
	testkit.Eventually(t, 30*time.Second, "the first run's assignment", func() bool { return held(before)[topic] == 3 })
	r.stop()
	before.crash() // a static member: the group keeps its place and plan
	createTopic(t, addrs, rt, 3)

	after, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	r = startConsuming(after, nil)
	t.Cleanup(func() { r.stop(); _ = after.Close() })
	testkit.Eventually(t, 30*time.Second, "the restarted leader holding the retry topic's partitions", func() bool {
		n := held(after)
		return n[topic] == 3 && n[rt] == 3
	})
}
