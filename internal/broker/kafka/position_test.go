package kafka

import (
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// A record's position names its topic, partition and offset, whatever
// their length.
func TestPosition(t *testing.T) {
	long := strings.Repeat("t", 200)
	for _, c := range []struct {
		r    kgo.Record
		want string
	}{
		{kgo.Record{Topic: "orders", Partition: 0, Offset: 0}, "kafka:orders/0/0"},
		{kgo.Record{Topic: "orders", Partition: 11, Offset: 9223372036854775807}, "kafka:orders/11/9223372036854775807"},
		{kgo.Record{Topic: long, Partition: 2147483647, Offset: 42}, "kafka:" + long + "/2147483647/42"},
	} {
		if got := position(&c.r); got != c.want {
			t.Errorf("position = %q, want %q", got, c.want)
		}
	}
}
