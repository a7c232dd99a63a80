package handler

import (
	"maps"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
)

// maxNames bounds what a nameCache remembers: a producer that sends a new
// header name with every message must not grow it without end. Past it,
// new names are canonicalized on every call, as without a cache.
const maxNames = 512

// nameCache remembers the request header name that a message header name
// (or, with prefix "ce-", an attribute name) becomes. Producers send the
// same few names on every message, and canonicalizing one that is not
// already canonical (tenant → Tenant, ce- + tenant → Ce-Tenant) allocates
// a string on every call. It is safe for concurrent use.
type nameCache struct {
	prefix string
	// names is read without a lock and replaced whole on each addition:
	// additions stop soon, while reads go on for every call.
	names atomic.Pointer[map[string]string]
	mu    sync.Mutex // serializes additions
}

var (
	messageNames   nameCache
	attributeNames = nameCache{prefix: "ce-"}
)

// canonical is http.CanonicalHeaderKey(c.prefix + k).
func (c *nameCache) canonical(k string) string {
	m := c.names.Load()
	if m != nil {
		if v, ok := (*m)[k]; ok {
			return v
		}
	}
	v := http.CanonicalHeaderKey(c.prefix + k)
	if m == nil || len(*m) < maxNames {
		c.add(k, v)
	}
	return v
}

func (c *nameCache) add(k, v string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var next map[string]string
	if old := c.names.Load(); old != nil {
		if _, ok := (*old)[k]; ok || len(*old) >= maxNames {
			return
		}
		next = make(map[string]string, len(*old)+1)
		maps.Copy(next, *old)
	} else {
		next = make(map[string]string, 1)
	}
	// A copy: k may point into a larger buffer that the message came in.
	next[strings.Clone(k)] = v
	c.names.Store(&next)
}
