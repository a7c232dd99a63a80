GO       ?= go
PKGS     := ./...
# Broker tests talk to the RabbitMQ that .ci/run (or you) started.
export HANDOFF_RABBITMQ_URL ?= amqp://guest:guest@127.0.0.1:5672/

.PHONY: build demo test test-short lint fmt fuzz bench clean

build:
	$(GO) build -o bin/sidecar ./cmd/sidecar

# The whole pipeline on an embedded Kafka, with a demo producer and app.
demo: build
	bin/sidecar dev

# The full suite, broker tests included, with the race detector.
test:
	$(GO) test -race -count=1 -timeout 15m $(PKGS)

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
	$(GO) test -run='^$$' -fuzz=FuzzDecode -fuzztime=30s ./internal/journal/
	$(GO) test -run='^$$' -fuzz=FuzzKeyDecode -fuzztime=30s ./internal/journal/
	$(GO) test -run='^$$' -fuzz=FuzzSetHeaders -fuzztime=30s ./internal/handler/

# Benchmarks: journal micro-benchmarks, then the end-to-end drain of a
# preloaded queue by the sidecar (each journal.sync mode) and by a
# hand-written consumer, in one run. Needs the local RabbitMQ.
bench:
	$(GO) test -run='^$$' -bench=. -benchtime=2s ./internal/journal/
	$(GO) test -run='^$$' -bench=BenchmarkJournalSyncModes -benchtime=1x -timeout=30m ./cmd/sidecar/

clean:
	rm -rf bin
