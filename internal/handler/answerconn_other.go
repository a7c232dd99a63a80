//go:build !unix

package handler

import "net"

// newAnswerConn is c: a request written and its answer waited for in one
// turn is made on unix only (answerconn_unix.go).
func newAnswerConn(c net.Conn) net.Conn { return c }

type answerConn struct{ net.Conn }

func (a *answerConn) send(req []byte) error {
	_, err := a.Conn.Write(req)
	return err
}
