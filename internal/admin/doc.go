// Package admin is the admin API of a running sidecar: the gRPC service
// handoff.admin.v1.Admin and the same calls as REST/JSON (grpc-gateway),
// served on one listener, with the OpenAPI document at /v1/openapi.json.
//
// One net/http server speaks HTTP/1.1 and unencrypted HTTP/2 (h2c, prior
// knowledge, as gRPC clients dial). A request that is HTTP/2 with an
// application/grpc content type goes to the grpc.Server (through its
// ServeHTTP); every other request goes to the gateway's mux, which calls the
// same service in process. One port, one accept loop, one shutdown, and no
// protocol sniffing of the connection's first bytes.
//
// Every /v1 call, REST or gRPC, needs "Authorization: Bearer <token>"; the
// token is compared in constant time (see ReadToken for the file it comes
// from). A missing or wrong token gets 401 or codes.Unauthenticated with
// nothing else in the answer. With anonymous reads allowed, the status may
// be asked without a token (nothing else: an event's timeline quotes the
// app's answers); a call that brings a token must bring the right one. The
// REST guard stands in front of every path, not only "/v1/": the gateway
// decodes escaped slashes into routes. The OpenAPI document is open: it holds no state of the sidecar.
//
// The dead-letter and replay calls go through DeadLetters (a
// *deadletter.Manager); they always need the token, since a dead letter's
// body and headers may hold personal data. A change they record names who
// made it: Options.TokenName (admin.token_name), then "/" and the operator
// the request names, which is not verified: it tells apart the people
// behind one token, no more.
//
// # Caveats
//
// The listener has no TLS: the token travels in clear. Keep admin.listen on
// loopback, or put it behind a proxy that terminates TLS.
//
// grpc.Server.ServeHTTP is marked experimental in grpc-go, does not offer
// every feature of grpc-go's own HTTP/2 transport, and is slower than it:
// fine for an operator's calls, which is all this port carries. The choice
// buys one port without a connection multiplexer guessing the protocol.
package admin
