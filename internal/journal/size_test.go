package journal

import (
	"math"
	"strings"
	"testing"
	"time"
)

// size must bound the encoding, or Encode would reallocate on every commit.
func TestSizeBoundsTheEncoding(t *testing.T) {
	big := map[string]string{}
	for i := range 20 {
		big[strings.Repeat("k", i+1)] = strings.Repeat("v", 100*i)
	}
	for _, r := range []Record{
		{Kind: Received},
		{Kind: Outcome, At: time.Unix(0, math.MaxInt64), Hop: math.MaxInt32, Attempt: math.MinInt32, Outcome: 255,
			Status: math.MaxInt32, Latency: math.MaxInt64, Dest: "retry.10m", Detail: strings.Repeat("é", 300), Position: "kafka:t/1/2"},
		{Kind: Transferring, At: time.Now(), Hop: 3, Attempt: 2, Dest: "dlq", Trail: big},
	} {
		if n, max := len(r.Encode(nil)), r.size(); n > max {
			t.Errorf("%v: encoding is %d bytes, size() says at most %d", r.Kind, n, max)
		}
	}
}
