package config

import (
	"net"
	"strings"
)

func (a *Admin) validate(ps *Problems) {
	validateListen("admin.listen", a.Listen, false, ps)
	if a.AllowAnonymousRead && a.Listen != "" && !LoopbackAddr(a.Listen) {
		ps.add("admin.allow_anonymous_read", "only on a loopback listener: admin.listen %q is reachable from other hosts; set a token_file instead", a.Listen)
	}
}

// Enabled reports whether the admin API is served: with a token, or with
// anonymous reads allowed.
func (a Admin) Enabled() bool { return a.TokenFile != "" || a.AllowAnonymousRead }

// Notices are what an operator should know about a valid config that is
// not a problem: a part that is off, say.
func (c *Config) Notices() []string {
	var ns []string
	if !c.Admin.Enabled() {
		ns = append(ns, "admin API off: admin.token_file is not set (status and live event timelines are unavailable; `sidecar journal` still reads a stopped sidecar's journal)")
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
