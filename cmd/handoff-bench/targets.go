package main

import (
	"fmt"
	"os"
	"strings"
	"time"
)

// target is one of the performance goals the table is read against: a
// figure of this run, the bound it should meet, and which way.
type target struct {
	what   string
	goal   string
	value  float64 // NaN-free: ok is false when the run lacks the rows
	ok     bool
	atMost bool // the bound is an upper one
	bound  float64
	show   func(float64) string
}

func (t target) verdict() string {
	if !t.ok {
		return "not measured"
	}
	if t.atMost && t.value <= t.bound || !t.atMost && t.value >= t.bound {
		return "met"
	}
	if t.atMost {
		return fmt.Sprintf("missed: %.1f× the bound", t.value/t.bound)
	}
	return fmt.Sprintf("missed: %.0f%% of it", 100*t.value/t.bound)
}

// targets reads the goals against the run's rows. A row is found by its
// name; a run that left it out (-only, a failure) shows "not measured".
func targets(rows []row, lat []latencyRow) []target {
	find := func(name string) (row, bool) {
		for _, r := range rows {
			if r.name == name && r.note == "" && r.rate > 0 {
				return r, true
			}
		}
		return row{}, false
	}
	ratioOf := func(what, goal string, bound float64, side, base string) target {
		t := target{what: what, goal: goal, bound: bound, show: func(v float64) string { return fmt.Sprintf("%.2f×", v) }}
		s, ok1 := find(side)
		b, ok2 := find(base)
		t.ok = ok1 && ok2
		if t.ok {
			t.value = s.rate / b.rate
		}
		return t
	}
	cpuOf := func(what, goal string, bound float64, side, base string) target {
		t := target{what: what, goal: goal, bound: bound, atMost: true, show: func(v float64) string { return fmt.Sprintf("%.2f×", v) }}
		s, ok1 := find(side)
		b, ok2 := find(base)
		t.ok = ok1 && ok2 && b.cpu > 0
		if t.ok {
			t.value = s.cpu / b.cpu
		}
		return t
	}
	// Memory over the baseline's: what the sidecar adds, peak RSS (the
	// journal's mapped pages among it) and anonymous memory.
	memOf := func(what, goal string, bound float64, side, base string, anon bool) target {
		t := target{what: what, goal: goal, bound: bound, atMost: true, show: func(v float64) string { return fmt.Sprintf("%+.0f MB", v) }}
		s, ok1 := find(side)
		b, ok2 := find(base)
		t.ok = ok1 && ok2
		if anon {
			t.value = s.anonMB - b.anonMB
		} else {
			t.value = s.rssMB - b.rssMB
		}
		return t
	}
	const (
		rabbitBase  = "RabbitMQ baseline (hand-written amqp091-go)"
		rabbitSide  = "RabbitMQ sidecar, journal batch"
		rabbitBatch = "RabbitMQ sidecar, journal batch, batches of 64"
		kafkaBase   = "Kafka baseline (hand-written franz-go)"
		kafkaSide   = "Kafka sidecar, ordering none, journal batch"
		kafkaBatch  = "Kafka sidecar, ordering none, journal batch, batches of 64"
	)
	out := []target{
		ratioOf("RabbitMQ, one message a request, rate", "≥ 0.85× the baseline", 0.85, rabbitSide, rabbitBase),
		ratioOf("Kafka, one message a request, rate", "≥ 0.85× the baseline", 0.85, kafkaSide, kafkaBase),
		cpuOf("RabbitMQ, CPU per message", "≤ 1.3× the baseline's", 1.3, rabbitSide, rabbitBase),
		cpuOf("Kafka, CPU per message", "≤ 1.3× the baseline's", 1.3, kafkaSide, kafkaBase),
		ratioOf("RabbitMQ, batches of 64, rate", "≥ 1.5× the single-message baseline", 1.5, rabbitBatch, rabbitBase),
		ratioOf("Kafka, batches of 64, rate", "≥ 1.5× the single-message baseline", 1.5, kafkaBatch, kafkaBase),
	}
	// Paced at a third of the baseline's drain rate: the first pair of
	// each broker's latency rows. A sidecar that falls behind has a p99
	// of seconds, so the bound says it keeps up too.
	for _, broker := range []string{"RabbitMQ", "Kafka"} {
		t := target{what: broker + ", added p99 at a third of the baseline's drain rate", goal: "≤ the baseline's + 10 ms", bound: float64(10 * time.Millisecond), atMost: true,
			show: signedDuration}
		for i := 0; i+1 < len(lat); i++ {
			base, side := lat[i], lat[i+1]
			if strings.HasPrefix(base.name, broker+" baseline") && strings.Contains(base.name, "a third of its drain rate") && base.note == "" && side.note == "" {
				t.ok, t.value = true, float64(side.p99-base.p99)
				break
			}
		}
		out = append(out, t)
	}
	return append(out,
		memOf("RabbitMQ, peak RSS over the baseline's", "≤ +32 MB", 32, rabbitSide, rabbitBase, false),
		memOf("RabbitMQ, peak anon over the baseline's", "≤ +16 MB", 16, rabbitSide, rabbitBase, true),
		memOf("Kafka, peak RSS over the baseline's", "≤ +32 MB", 32, kafkaSide, kafkaBase, false),
		memOf("Kafka, peak anon over the baseline's", "≤ +16 MB", 16, kafkaSide, kafkaBase, true))
}

func renderTargets(rows []row, lat []latencyRow) string {
	var b strings.Builder
	b.WriteString("\n## Targets\n\nThe goals this table is read against, with this run's figures. Ratios are taken within the run,\n" +
		"between the median rounds of rows run in turn, so a slower stretch of the machine moves every rate\n" +
		"but not the ratios much; the journal's bytes per hand-off come from its own benchmark\n" +
		"(`BenchmarkHandoffs`, in the `go test -bench` output of `make bench`).\n\n")
	b.WriteString("| target | goal | this run | |\n|---|---|---:|---|\n")
	for _, t := range targets(rows, lat) {
		v := "—"
		if t.ok {
			v = t.show(t.value)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", t.what, t.goal, v, t.verdict())
	}
	b.WriteString(contractCost(rows))
	return b.String()
}

// contractCost says what the contract's headers cost the app, from the two
// ceilings: its rate with them against without, and its CPU a request.
func contractCost(rows []row) string {
	var plain, contract row
	for _, r := range rows {
		switch {
		case r.note != "" || r.rate == 0:
		case strings.HasPrefix(r.name, "ceiling:"):
			plain = r
		case strings.HasPrefix(r.name, "ceiling, the sidecar's headers"):
			contract = r
		}
	}
	if plain.rate == 0 || contract.rate == 0 || plain.appCPU == 0 {
		return ""
	}
	return fmt.Sprintf("\nThe rates above are what the app allows. With the headers the sidecar's requests carry, the app's\n"+
		"ceiling is %.2f× the one without, and its CPU a request %+.0f%% (%.2f against %.2f s/10k): the floor the\n"+
		"contract sets under the sidecar's rate, which the baseline, posting bare requests, does not pay.\n",
		contract.rate/plain.rate, 100*(contract.appCPU/plain.appCPU-1), contract.appCPU, plain.appCPU)
}

// keptMarker starts the part of the output file written by hand: it is
// carried over when the file is written again.
const keptMarker = "<!-- Below this line is written by hand; handoff-bench keeps it when it writes the file again. -->"

// kept returns the hand-written part of the file at path, from its marker
// on, or "" when it has none.
func kept(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if i := strings.Index(string(data), keptMarker); i >= 0 {
		return "\n" + string(data[i:])
	}
	return ""
}

// signedDuration shows v nanoseconds with its sign: +6ms, -4ms.
func signedDuration(v float64) string {
	d := time.Duration(v).Round(time.Millisecond)
	if d < 0 {
		return d.String()
	}
	return "+" + d.String()
}
