package broker

import "testing"

func TestOrdering(t *testing.T) {
	for _, tc := range []struct {
		o              Ordering
		valid, inPlace bool
	}{
		{OrderNone, true, false},
		{OrderKey, true, true},
		{OrderPartition, true, true},
		{"", false, false},
		{"keys", false, false},
		{"Partition", false, false},
	} {
		if got := tc.o.Valid(); got != tc.valid {
			t.Errorf("%q.Valid() = %v, want %v", tc.o, got, tc.valid)
		}
		if got := tc.o.InPlace(); got != tc.inPlace {
			t.Errorf("%q.InPlace() = %v, want %v", tc.o, got, tc.inPlace)
		}
	}
}
