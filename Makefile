GO       ?= go
PKGS     := ./...
# Broker tests talk to the local RabbitMQ and Kafka that `make brokers` starts.
export HANDOFF_RABBITMQ_URL ?= amqp://guest:guest@127.0.0.1:5672/
export HANDOFF_KAFKA_BROKERS ?= 127.0.0.1:19092

.PHONY: build demo brokers brokers-stop browser test test-short lint fmt fuzz bench soak proto clean image

VERSION    ?= 0.1.0

# The version and commit a build says it is (sidecar --version, the
# handoff_build_info metric): set here, since a machine may build with
# -buildvcs=false.
REVISION := $(shell r=$$(git rev-parse --short=12 HEAD 2>/dev/null) && { git diff --quiet HEAD 2>/dev/null || r=$$r-dirty; echo $$r; })
LDFLAGS  := -X handoff.dev/handoff/internal/buildinfo.version=$(VERSION) -X handoff.dev/handoff/internal/buildinfo.revision=$(REVISION)

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/sidecar ./cmd/sidecar
	$(GO) build -o bin/sidecar-injector ./deploy/sidecar-injector
	$(GO) build -o bin/handoff-bench ./cmd/handoff-bench

# Container images of the sidecar and the sidecar injector, both built by
# the Dockerfile's one build stage with `make build` (docker, or podman as
# DOCKER=podman).
DOCKER     ?= docker
IMAGE_REPO ?= ghcr.io/handoff-dev
image:
	$(DOCKER) build --target sidecar -t $(IMAGE_REPO)/sidecar:$(VERSION) .
	$(DOCKER) build --target sidecar-injector -t $(IMAGE_REPO)/sidecar-injector:$(VERSION) .

# The whole pipeline on an embedded Kafka, with a demo producer and app.
demo: build
	bin/sidecar dev

# Install (when missing) and start the local RabbitMQ and Apache Kafka.
brokers:
	scripts/rabbitmq-local start
	scripts/kafka-local start

brokers-stop:
	-scripts/kafka-local stop
	-scripts/rabbitmq-local stop

# Install (when missing) the Chromium the console's browser test drives.
browser:
	scripts/chromium-local install

# The full suite, broker tests included, with the race detector. Most
# broker tests wait on brokers, timers and the app, not on the CPU: six run
# at once (go test's default is one per core).
test: brokers browser
	$(GO) test -race -count=1 -parallel 6 -timeout 15m $(PKGS)

# Unit tests only (no broker needed).
test-short:
	$(GO) test -short -count=1 $(PKGS)

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

fmt:
	gofmt -w $$(git ls-files '*.go')

# A short pass of every fuzz target.
fuzz:
	$(GO) test -run='^$$' -fuzz=FuzzParse -fuzztime=30s ./internal/config/
	$(GO) test -run='^$$' -fuzz=FuzzParseTrail -fuzztime=30s ./internal/broker/
	$(GO) test -run='^$$' -fuzz=FuzzStructuredEvent -fuzztime=30s ./internal/broker/
	$(GO) test -run='^$$' -fuzz=FuzzDecode -fuzztime=30s ./internal/journal/
	$(GO) test -run='^$$' -fuzz=FuzzKeyDecode -fuzztime=30s ./internal/journal/
	$(GO) test -run='^$$' -fuzz=FuzzPart -fuzztime=30s ./internal/journal/
	$(GO) test -run='^$$' -fuzz=FuzzSetHeaders -fuzztime=30s ./internal/handler/
	$(GO) test -run='^$$' -fuzz=FuzzStructuredHeaders -fuzztime=30s ./internal/handler/
	$(GO) test -run='^$$' -fuzz=FuzzEncodeBatch -fuzztime=30s ./internal/handler/
	$(GO) test -run='^$$' -fuzz=FuzzURL -fuzztime=30s ./internal/redact/
	$(GO) test -run='^$$' -fuzz=FuzzLedgerRecord -fuzztime=30s ./internal/deadletter/

# Benchmarks: hot-path micro-benchmarks, then the harness: the sidecar
# binary against hand-written consumers and the loopback ceiling, on the
# local RabbitMQ and Kafka, written to BENCH.md. BENCH_N sets the backlog,
# BENCH_ROUNDS the rounds of the rows the targets compare, each side shown
# as its median round: on this machine one round of a pair can land 15%
# either way, or stall for a second, and a median of three still moved with
# one such round.
BENCH_N ?= 50000
BENCH_ROUNDS ?= 5
bench: brokers build
	$(GO) test -run='^$$' -bench=. -benchmem -benchtime=2s ./internal/journal/ ./internal/budget/ ./internal/handler/ ./internal/telemetry/ ./internal/dispatch/
	bin/handoff-bench -n $(BENCH_N) -rounds $(BENCH_ROUNDS) -out BENCH.md

# Ten minutes of steady load on both brokers with failures, poison, a
# SIGKILL a minute and RabbitMQ connections force-closed: every message
# accounted for, RSS, goroutines and the journal flat (the series is
# printed). Not part of make test. SOAK sets the duration.
SOAK ?= 10m
soak: brokers
	HANDOFF_SOAK=$(SOAK) $(GO) test -tags soak -run '^TestSoak$$' -count=1 -v -timeout 60m ./cmd/sidecar/

# Regenerate the code of api/ from its contracts with pinned tools, run
# from their Go modules (buf compiles the protos itself; no protoc, no Buf
# registry), and record the digests the staleness test checks.
BUF ?= $(GO) run github.com/bufbuild/buf/cmd/buf@v1.75.0
proto:
	cd api && $(BUF) generate --template buf.gen.yaml
	cd api && $(BUF) generate --template buf.gen.admin.yaml --path admin/v1
	cd api && find . -type f \( -name 'buf.*' -o -name '*.proto' -o -name '*.yaml' -o -name '*.pb.go' -o -name '*.pb.gw.go' -o -name '*.swagger.json' \) \
		| sed 's|^\./||' | LC_ALL=C sort | xargs sha256sum > generated.sum

clean:
	rm -rf bin
