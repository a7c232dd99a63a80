# syntax=docker/dockerfile:1
#
# make image: the sidecar and the sidecar injector, static binaries on a
# distroless base, running as a user of their own. Both come from one build
# stage that runs `make build`, the command a developer runs; a test
# (deploy/sidecar-injector/image_test.go) keeps the two the same.

FROM golang:1.26 AS build
WORKDIR /src
# Static: no libc in the images below.
ENV CGO_ENABLED=0 GOFLAGS=-trimpath
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN make build

FROM gcr.io/distroless/static-debian12:nonroot AS sidecar
COPY --from=build /src/bin/sidecar /sidecar
USER 65532:65532
ENTRYPOINT ["/sidecar"]

FROM gcr.io/distroless/static-debian12:nonroot AS sidecar-injector
COPY --from=build /src/bin/sidecar-injector /sidecar-injector
USER 65532:65532
ENTRYPOINT ["/sidecar-injector"]
