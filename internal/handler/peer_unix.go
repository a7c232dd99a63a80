//go:build unix

package handler

import (
	"net"
	"syscall"
)

// peerClosed reports whether an idle connection is no longer fit to carry a
// request: the app closed it, or sent something unasked. It looks without
// reading (MSG_PEEK) and without waiting.
func peerClosed(c net.Conn) bool {
	if t, ok := c.(interface{ NetConn() net.Conn }); ok { // TLS: the socket under it
		c = t.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	unfit := false
	err = rc.Read(func(fd uintptr) bool {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		unfit = n > 0 || err == nil || (err != syscall.EAGAIN && err != syscall.EWOULDBLOCK && err != syscall.EINTR)
		return true
	})
	return unfit || err != nil
}
