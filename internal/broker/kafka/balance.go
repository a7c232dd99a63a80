package kafka

import (
	"cmp"
	"maps"
	"slices"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A source's group consumes its topic and its retry topics together. The
// cooperative-sticky balancer evens out each member's total, not each
// topic: with 6 + 6 + 6 partitions and two members, one member can hold
// all of the source topic and the other only retry partitions, idle for
// fresh records while its peer is busy. perTopicBalancer spreads every
// topic's partitions evenly over the members that consume it, and stays
// cooperative and sticky within that: a member keeps what it owns up to
// its share, and what moves is revoked first (kgo's AdjustCooperative),
// so no partition is consumed by two members at once.
//
// The group advertises it first and cooperative-sticky second: during a
// rolling upgrade from a release that had only cooperative-sticky, the
// coordinator keeps that one until every member offers this one. Both are
// cooperative, so the switch needs no stop of the group.

// groupBalancers are the balancers a source's group offers, preferred
// first.
func groupBalancers(own *perTopicBalancer) []kgo.GroupBalancer {
	return []kgo.GroupBalancer{own, kgo.CooperativeStickyBalancer()}
}

// perTopicProtocol is the balancer's protocol name in JoinGroup.
const perTopicProtocol = "handoff-cooperative-per-topic"

// perTopicBalancer is one client's: it remembers whether the leader's last
// join was balanced (see unbalanced).
type perTopicBalancer struct {
	// joined is set when this member, as leader, is given the group's
	// members, and cleared when it balances them.
	joined atomic.Bool
}

var _ kgo.GroupBalancer = (*perTopicBalancer)(nil)

// unbalanced reports, once, whether this member led the latest join
// without balancing it. That is a static member restarted as the leader
// (KIP-814): the coordinator hands it the group's previous plan and tells
// it not to balance. kgo checks that plan against its own balancers' and
// rebalances if it is stale, but not against a balancer of the client's;
// a plan made before the retry topics existed, or before a tier was
// added, would stand, and their partitions would have no consumer. The
// client forces the rebalance instead (Client.assigned).
func (b *perTopicBalancer) unbalanced() bool { return b.joined.Swap(false) }

func (*perTopicBalancer) ProtocolName() string { return perTopicProtocol }
func (*perTopicBalancer) IsCooperative() bool  { return true }

// JoinGroupMetadata is the consumer protocol's member metadata with the
// partitions this member owns, which a cooperative balancer needs to keep
// them where they are.
func (*perTopicBalancer) JoinGroupMetadata(interests []string, current map[string][]int32, generation int32) []byte {
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Version = 3
	meta.Topics = interests
	meta.Generation = generation
	for _, t := range slices.Sorted(maps.Keys(current)) {
		owned := kmsg.NewConsumerMemberMetadataOwnedPartition()
		owned.Topic = t
		owned.Partitions = current[t]
		meta.OwnedPartitions = append(meta.OwnedPartitions, owned)
	}
	return meta.AppendTo(nil)
}

func (*perTopicBalancer) ParseSyncAssignment(assignment []byte) (map[string][]int32, error) {
	return kgo.ParseConsumerSyncAssignment(assignment)
}

func (b *perTopicBalancer) MemberBalancer(members []kmsg.JoinGroupResponseMember) (kgo.GroupMemberBalancer, map[string]struct{}, error) {
	b.joined.Store(true)
	cb, err := kgo.NewConsumerBalancer(b, members)
	if err != nil {
		return nil, nil, err
	}
	return cb, cb.MemberTopics(), nil
}

// Balance plans every topic on its own (balanceTopic), the members'
// claims at the highest generation standing, then takes out of the plan
// what moves between members, to be revoked before it is assigned.
func (b *perTopicBalancer) Balance(cb *kgo.ConsumerBalancer, topics map[string]int32) kgo.IntoSyncAssignment {
	b.joined.Store(false)
	members := cb.Members()
	metas := make([]*kmsg.ConsumerMemberMetadata, len(members))
	for i := range members {
		_, metas[i] = cb.MemberAt(i)
	}
	load := make([]int, len(members))
	plan := cb.NewPlan()
	for _, topic := range slices.Sorted(maps.Keys(topics)) {
		var who []int // members consuming topic, in the group's order
		var claims []topicClaim
		for i, meta := range metas {
			if meta == nil || !slices.Contains(meta.Topics, topic) {
				continue
			}
			c := topicClaim{generation: meta.Generation, load: load[i]}
			for _, o := range meta.OwnedPartitions {
				if o.Topic == topic {
					c.owned = o.Partitions
				}
			}
			who = append(who, i)
			claims = append(claims, c)
		}
		for j, parts := range balanceTopic(topics[topic], claims) {
			load[who[j]] += len(parts)
			if len(parts) > 0 {
				plan.AddPartitions(&members[who[j]], topic, parts)
			}
		}
	}
	plan.AdjustCooperative(cb)
	return plan
}

// topicClaim is one member, as balanceTopic sees it: what it says it owns
// of the topic, the generation it owned it in, and how many partitions of
// the topics before this one it was given.
type topicClaim struct {
	owned      []int32
	generation int32
	load       int
}

// balanceTopic shares the partitions 0…n-1 of one topic among members: each
// gets n/m of them, and n%m members one more. Those that own the most get
// the larger shares (the fewer moves), ties going to the least loaded so
// far, so that the extra partitions of several topics do not pile onto one
// member. A partition owned by two members (one missed a rebalance) is the
// one's with the higher generation, the first's on a tie. A member keeps
// its owned partitions up to its share, lowest first; the rest fill the
// shares still open, in order.
func balanceTopic(n int32, members []topicClaim) [][]int32 {
	m := len(members)
	out := make([][]int32, m)
	if m == 0 || n <= 0 {
		return out
	}
	owner := make([]int, n)
	for p := range owner {
		owner[p] = -1
	}
	for i, c := range members {
		for _, p := range c.owned {
			if p < 0 || p >= n {
				continue
			}
			if o := owner[p]; o < 0 || c.generation > members[o].generation {
				owner[p] = i
			}
		}
	}
	kept := make([][]int32, m)
	for p, o := range owner {
		if o >= 0 {
			kept[o] = append(kept[o], int32(p))
		}
	}
	order := make([]int, m)
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		if c := cmp.Compare(len(kept[b]), len(kept[a])); c != 0 {
			return c
		}
		return cmp.Compare(members[a].load, members[b].load)
	})
	share := make([]int, m)
	base, extra := int(n)/m, int(n)%m
	for rank, i := range order {
		share[i] = base
		if rank < extra {
			share[i]++
		}
	}
	var free []int32
	for i := range members {
		k := min(len(kept[i]), share[i])
		out[i] = append(out[i], kept[i][:k]...)
		free = append(free, kept[i][k:]...)
	}
	for p, o := range owner {
		if o < 0 {
			free = append(free, int32(p))
		}
	}
	slices.Sort(free)
	for _, i := range order {
		for len(out[i]) < share[i] && len(free) > 0 {
			out[i] = append(out[i], free[0])
			free = free[1:]
		}
		slices.Sort(out[i])
	}
	return out
}
