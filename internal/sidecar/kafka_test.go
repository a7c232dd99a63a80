package sidecar

import (
	"regexp"
	"strings"
	"testing"

	"handoff.dev/handoff/internal/config"
)

// legalInstanceID is what Kafka accepts as a group instance id.
var legalInstanceID = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)

func TestGroupInstanceID(t *testing.T) {
	const journalID = "0123456789abcdef0123456789abcdef"
	tests := []struct {
		name, source, configured, want string
		hashed                         bool // want is followed by "-" and a hash of the name
	}{
		{name: "made from the journal and the source", source: "orders", want: "handoff-" + journalID + "-orders"},
		{name: "configured wins", source: "orders", configured: "pod-7", want: "pod-7"},
		{name: "characters Kafka refuses are replaced", source: "orders/eu west", want: "handoff-" + journalID + "-orders_eu_west", hashed: true},
		{name: "a long name is cut", source: strings.Repeat("n", 300), want: "handoff-" + journalID + "-" + strings.Repeat("n", maxNameInID), hashed: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := groupInstanceID(tt.source, &config.Kafka{InstanceID: tt.configured}, journalID)
			if rest, ok := strings.CutPrefix(got, tt.want); !ok || (rest != "") != tt.hashed || tt.hashed && len(rest) != 9 {
				t.Errorf("groupInstanceID(%q) = %q, want %q (and a hash: %v)", tt.source, got, tt.want, tt.hashed)
			}
			if !legalInstanceID.MatchString(got) {
				t.Errorf("groupInstanceID(%q) = %q: not a legal Kafka instance id", tt.source, got)
			}
		})
	}
	// Names made the same by the replacement still give two ids.
	a := groupInstanceID("a/b", &config.Kafka{}, journalID)
	b := groupInstanceID("a:b", &config.Kafka{}, journalID)
	if a == b {
		t.Errorf("sources a/b and a:b share the instance id %q", a)
	}
}

// The transactional id follows the group member: the same across restarts
// on one journal, different for another member of the group.
func TestTransactionalIDFollowsTheMember(t *testing.T) {
	k := &config.Kafka{Group: "g"}
	one := transactionalID("orders", k.Group, groupInstanceID("orders", k, "journal-one"))
	again := transactionalID("orders", k.Group, groupInstanceID("orders", k, "journal-one"))
	other := transactionalID("orders", k.Group, groupInstanceID("orders", k, "journal-two"))
	if one != again || one == other {
		t.Errorf("transactional ids %q, %q (same journal), %q (another journal)", one, again, other)
	}
	if want := "handoff/orders/g/pod-7"; transactionalID("orders", "g", groupInstanceID("orders", &config.Kafka{Group: "g", InstanceID: "pod-7"}, "journal-one")) != want {
		t.Errorf("with instance_id set the transactional id is not %q", want)
	}
}
