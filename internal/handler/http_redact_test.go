package handler

import (
	"context"
	"io"
	"net"
	"net/url"
	"strings"
	"testing"

	"handoff.dev/handoff/internal/broker"
)

// The handler's password, sent as basic auth, is in no error and no Detail:
// those reach the log, the journal and the handoff-error header of retry
// and DLQ copies.
func TestHandlerPasswordInNoDetail(t *testing.T) {
	const pass = "Pw-5d1c9e"
	t.Run("a URL that does not parse", func(t *testing.T) {
		_, err := NewHTTP(HTTPOptions{URL: "http://app:" + pass + "/x@127.0.0.1/events", MaxConcurrency: 1, Classifier: mustClassifier(t, nil)})
		if err == nil || strings.Contains(err.Error(), pass) || !strings.Contains(err.Error(), "app:xxxxx@") {
			t.Errorf("NewHTTP error %v: want one that names the URL without its password", err)
		}
	})
	t.Run("the app unreachable", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close() // nothing listens there now
		h := newClient(t, "http://app:"+pass+"@"+addr+"/events", 1)
		res := h.Deliver(context.Background(), request(&broker.Message{Body: []byte("x")}))
		if res.Detail == "" || strings.Contains(res.Detail, pass) {
			t.Errorf("Detail %q: want the failure without the password", res.Detail)
		}
	})
	t.Run("an error quoting the URL", func(t *testing.T) {
		err := &url.Error{Op: "Post", URL: "http://app:" + pass + "@127.0.0.1/events", Err: io.ErrUnexpectedEOF}
		if d := errorDetail(err); strings.Contains(d, pass) || !strings.Contains(d, "unexpected EOF") {
			t.Errorf("errorDetail = %q: want the reason without the password", d)
		}
	})
}
