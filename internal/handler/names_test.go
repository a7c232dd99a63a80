package handler

import (
	"net/http"
	"strconv"
	"sync"
	"testing"
)

func TestNameCacheCanonical(t *testing.T) {
	tests := []struct {
		name   string
		prefix string
		k      string
	}{
		{"lower case", "", "tenant"},
		{"already canonical", "", "X-Tenant"},
		{"mixed", "", "x-rEQUEST-id"},
		{"common header", "", "content-type"},
		{"attribute", "ce-", "tenant"},
		{"attribute with a digit", "ce-", "v2attr"},
		{"not a token", "", "x tenant"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &nameCache{prefix: tt.prefix}
			want := http.CanonicalHeaderKey(tt.prefix + tt.k)
			for i := range 3 {
				if got := c.canonical(tt.k); got != want {
					t.Errorf("call %d: canonical(%q) = %q, want %q", i, tt.k, got, want)
				}
			}
		})
	}
}

// A name seen before costs no allocation.
func TestNameCacheRemembers(t *testing.T) {
	c := &nameCache{prefix: "ce-"}
	c.canonical("tenant")
	if n := testing.AllocsPerRun(100, func() { c.canonical("tenant") }); n != 0 {
		t.Errorf("canonical of a name seen before: %v allocations, want 0", n)
	}
}

// Past maxNames names the cache stops growing and goes on answering.
func TestNameCacheIsBounded(t *testing.T) {
	c := &nameCache{}
	for i := range maxNames + 100 {
		k := "x-name-" + strconv.Itoa(i)
		if got, want := c.canonical(k), http.CanonicalHeaderKey(k); got != want {
			t.Fatalf("canonical(%q) = %q, want %q", k, got, want)
		}
	}
	if n := len(*c.names.Load()); n != maxNames {
		t.Errorf("cache holds %d names, want %d", n, maxNames)
	}
}

func TestNameCacheConcurrentUse(t *testing.T) {
	c := &nameCache{}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				k := "x-h" + strconv.Itoa((g*31+i)%64)
				if got, want := c.canonical(k), http.CanonicalHeaderKey(k); got != want {
					t.Errorf("canonical(%q) = %q, want %q", k, got, want)
					return
				}
			}
		})
	}
	wg.Wait()
	if n := len(*c.names.Load()); n != 64 {
		t.Errorf("cache holds %d names, want 64", n)
	}
}
