package budget

import (
	"testing"
	"time"
)

func TestBackoffDoublesUpToMaxAndResets(t *testing.T) {
	b := NewBackoff(100*time.Millisecond, time.Second)
	for i, w := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		if p := b.Peek(); p != w*time.Millisecond {
			t.Errorf("before wait %d Peek says %v, want %v", i+1, p, w*time.Millisecond)
		}
		if d := b.Next(); d != w*time.Millisecond {
			t.Errorf("wait %d = %v, want %v", i+1, d, w*time.Millisecond)
		}
	}
	b.Reset()
	if d := b.Next(); d != 100*time.Millisecond {
		t.Errorf("after Reset the wait is %v, want the minimum", d)
	}
}
