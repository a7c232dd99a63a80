package config

import (
	"fmt"
	"net"
	"strings"

	"handoff.dev/handoff/internal/redact"
)

func (a *Admin) validate(ps *Problems) {
	validateListen("admin.listen", a.Listen, false, ps)
	if a.AllowAnonymousRead && a.Listen != "" && !LoopbackAddr(a.Listen) {
		ps.add("admin.allow_anonymous_read", "only on a loopback listener: admin.listen %q is reachable from other hosts; set a token_file instead", a.Listen)
	}
	if a.TokenName == "" || len(a.TokenName) > MaxTokenNameLen || !redact.Printable(a.TokenName) {
		ps.add("admin.token_name", "want 1 to %d bytes of printable text (who the dead-letter ledger records), got %q", MaxTokenNameLen, a.TokenName)
	}
}

// Enabled reports whether the admin API is served: with a token, or with
// anonymous reads allowed.
func (a Admin) Enabled() bool { return a.TokenFile != "" || a.Token != "" || a.AllowAnonymousRead }

// Notices are what an operator should know about a valid config that is
// not a problem: a part that is off, say.
func (c *Config) Notices() []string {
	var ns []string
	if !c.Admin.Enabled() {
		ns = append(ns, "admin API off: admin.token_file is not set (status and live event timelines are unavailable; `sidecar journal` still reads a stopped sidecar's journal)")
	}
	for i, s := range c.Sources {
		if k := s.Kafka; k != nil && k.ShareGroup != "" {
			ns = append(ns, fmt.Sprintf("sources[%d].kafka.share_group: %s — the brokers archive a record delivered share.delivery.count.limit times (Kafka's default 5) and give one held past share.record.lock.duration.ms (30 s) to another member; the sidecar reads both at start, moves a record on its last delivery but one to a retry tier uncalled (one to spare for a stop), and renews a call's record past a third of the lock. Records come in no order; retries are read by the consumer group %s.retries",
				i, k.ShareGroup, k.ShareGroup))
		}
		r := s.RabbitMQ
		if r == nil || r.DeliveryLimit == nil {
			continue
		}
		path := fmt.Sprintf("sources[%d].rabbitmq.delivery_limit", i)
		if n := *r.DeliveryLimit; n > 0 {
			ns = append(ns, fmt.Sprintf("%s: %d — a message the queue has delivered %d times is moved to a retry tier, never called; set it to the queues' x-delivery-limit, or 0 when they have none", path, n, n))
		} else {
			ns = append(ns, path+": 0 — the queues are taken to drop nothing after repeated returns; a quorum queue with a delivery limit would drop a message that keeps killing its consumer")
		}
	}
	return ns
}

// LoopbackAddr reports whether a host:port listener is reachable only from
// this host: its host is "localhost" or a loopback IP. An empty host (every
// interface) is not.
func LoopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
