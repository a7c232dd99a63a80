// Package api holds the sidecar's protobuf contracts and the code generated
// from them: handler/v1, the service an app implements to take messages over
// gRPC, and admin/v1, the admin API a running sidecar serves as gRPC and
// REST. `make proto` regenerates the code with pinned tools; the generated
// code is committed, and a test fails when it is stale.
package api
