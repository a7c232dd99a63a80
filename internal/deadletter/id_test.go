package deadletter

import (
	"errors"
	"testing"
)

func TestParseID(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want ID
		bad  bool
	}{
		{name: "rabbitmq", in: "orders.dlq/42", want: ID{Log: "orders.dlq", Partition: NoPartition, Offset: 42}},
		{name: "kafka", in: "orders.billing.dlq/3/1207", want: ID{Log: "orders.billing.dlq", Partition: 3, Offset: 1207}},
		{name: "queue name with slash", in: "a/b.dlq/0", want: ID{Log: "a/b.dlq", Partition: NoPartition, Offset: 0}},
		{name: "not a dlq", in: "orders/3", bad: true},
		{name: "no offset", in: "orders.dlq/", bad: true},
		{name: "negative", in: "orders.dlq/-1", bad: true},
		{name: "leading zero", in: "orders.dlq/01", bad: true},
		{name: "plus", in: "orders.dlq/+1", bad: true},
		{name: "partition too big", in: "t.g.dlq/4294967296/1", bad: true},
		{name: "empty", in: "", bad: true},
		{name: "no log", in: "/1", bad: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseID(tt.in)
			if tt.bad {
				if !errors.Is(err, ErrBadID) {
					t.Fatalf("ParseID(%q) = %v, %v; want ErrBadID", tt.in, got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseID(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
			}
			if got.String() != tt.in {
				t.Fatalf("String() = %q; want %q", got.String(), tt.in)
			}
			back, ok := idFromKey(got.key())
			if !ok || back != got {
				t.Fatalf("key round trip: %v, %v", back, ok)
			}
		})
	}
}
