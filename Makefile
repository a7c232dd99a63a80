GO       ?= go
PKGS     := ./...
# Broker tests talk to the local RabbitMQ and Kafka that `make brokers` starts.
export HANDOFF_RABBITMQ_URL ?= amqp://guest:guest@127.0.0.1:5672/
export HANDOFF_KAFKA_BROKERS ?= 127.0.0.1:19092

.PHONY: build demo brokers brokers-stop test test-short lint fmt fuzz bench clean

build:
	$(GO) build -o bin/sidecar ./cmd/sidecar

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

# The full suite, broker tests included, with the race detector.
test: brokers
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
bench: brokers
	$(GO) test -run='^$$' -bench=. -benchtime=2s ./internal/journal/
	$(GO) test -run='^$$' -bench=BenchmarkJournalSyncModes -benchtime=1x -timeout=30m ./cmd/sidecar/

clean:
	rm -rf bin
