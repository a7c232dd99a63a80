GO       ?= go
PKGS     := ./...
# Broker tests talk to the local RabbitMQ and Kafka that `make brokers` starts.
export HANDOFF_RABBITMQ_URL ?= amqp://guest:guest@127.0.0.1:5672/
export HANDOFF_KAFKA_BROKERS ?= 127.0.0.1:19092

.PHONY: build demo brokers brokers-stop test test-short lint fmt fuzz bench clean

build:
	$(GO) build -o bin/sidecar ./cmd/sidecar
	$(GO) build -o bin/handoff-bench ./cmd/handoff-bench

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
	$(GO) test -run='^$$' -fuzz=FuzzURL -fuzztime=30s ./internal/redact/

# Benchmarks: hot-path micro-benchmarks, then the harness: the sidecar
# binary against hand-written consumers and the loopback ceiling, on the
# local RabbitMQ and Kafka, written to BENCH.md. BENCH_N sets the backlog.
BENCH_N ?= 50000
bench: brokers build
	$(GO) test -run='^$$' -bench=. -benchmem -benchtime=2s ./internal/journal/ ./internal/budget/ ./internal/handler/
	bin/handoff-bench -n $(BENCH_N) -out BENCH.md

clean:
	rm -rf bin
