// Command handoff-bench measures Handoff against the consumer a team would
// hand-write on the same client library, and against the machine's loopback
// limit, in one run, and writes the table to BENCH.md.
//
//	handoff-bench [-n 50000] [-sidecar bin/sidecar] [-out BENCH.md]
//
// Every consumer drains the same preloaded backlog of 1 KiB messages (JSON
// with random content, which compression cannot shrink) into the same app, a
// separate process that answers at once. Rates are measured from the app's
// first call to its last new success; CPU seconds (rusage) and peak RSS
// (VmHWM) are the consumer process's own.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

func main() {
	if len(os.Args) > 1 {
		var err error
		switch os.Args[1] {
		case "app":
			err = profiled(runApp, os.Args[2:])
		case "baseline-rabbit":
			err = profiled(runBaselineRabbit, os.Args[2:])
		case "baseline-kafka":
			err = profiled(runBaselineKafka, os.Args[2:])
		case "baseline-kafka-share":
			err = profiled(runBaselineKafkaShare, os.Args[2:])
		default:
			err = runHarness(os.Args[1:])
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "handoff-bench:", err)
			os.Exit(1)
		}
		return
	}
	if err := runHarness(nil); err != nil {
		fmt.Fprintln(os.Stderr, "handoff-bench:", err)
		os.Exit(1)
	}
}

type options struct {
	n       int
	sidecar string
	out     string
	rabbit  string
	kafka   string
	// kafkaName names the Kafka broker in row names: "Kafka", or "kfake"
	// for the embedded one.
	kafkaName  string
	self       string
	skipSlow   bool
	profile    string // a directory for the runs' CPU profiles and the sidecar's allocation profiles
	only       string // rabbitmq or kafka: one broker's runs
	compare    string // a second sidecar binary: compare the two, nothing else
	rounds     int    // rounds of a comparison
	batch      bool   // a comparison of the batch-delivery rows
	timeIDs    bool   // message ids that sort by time (UUIDv7-shaped)
	compareIDs bool   // compare random ids with time-ordered ones on one build
	allocs     bool   // the sidecar writes an allocation profile too
	side       string // in a comparison, the side and round, for profile file names
	// metricsOff runs the sidecar with its metrics off (no metrics_listen):
	// the metrics' cost is the difference.
	metricsOff     bool
	compareMetrics bool // compare metrics on with metrics off on one build
	// paced runs only the latency rows, at this rate (msgs/s): the
	// baseline and the sidecar (or, with -compare, the two sidecars) in
	// turn, rounds times.
	paced float64
}

func runHarness(args []string) error {
	fs := flag.NewFlagSet("handoff-bench", flag.ContinueOnError)
	var o options
	fs.IntVar(&o.n, "n", 50000, "messages per run")
	fs.StringVar(&o.sidecar, "sidecar", "bin/sidecar", "the sidecar binary")
	fs.StringVar(&o.out, "out", "BENCH.md", "where to write the table")
	fs.StringVar(&o.rabbit, "rabbitmq", envOr("HANDOFF_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/"), "RabbitMQ URL")
	o.kafkaName = "Kafka"
	fs.StringVar(&o.kafka, "kafka", envOr("HANDOFF_KAFKA_BROKERS", "127.0.0.1:19092"), "Kafka bootstrap broker")
	fs.BoolVar(&o.skipSlow, "skip-slow", false, "leave out journal.sync: always and ordering: partition (slow by design)")
	fs.StringVar(&o.profile, "profile", "", "write each consumer run's CPU profile (pprof), its app's (.app.pprof), and the sidecar's allocations, into this directory")
	fs.StringVar(&o.only, "only", "", "rabbitmq or kafka: run one broker's columns")
	fs.StringVar(&o.compare, "compare", "", "another sidecar binary: run only the single-message sidecar rows (the batch rows with -batch), alternating the two binaries (each round the other goes first), and print them")
	fs.BoolVar(&o.compareIDs, "compare-ids", false, "like -compare, but alternate random message ids with time-ordered ones on the one sidecar binary")
	fs.BoolVar(&o.compareMetrics, "compare-metrics", false, "like -compare, but alternate metrics on with metrics off on the one sidecar binary")
	fs.IntVar(&o.rounds, "rounds", 3, "rounds of -compare, -compare-ids or -compare-metrics; in the table, rounds of the rows the targets compare, run in turn (each shown as its median round)")
	fs.BoolVar(&o.batch, "batch", false, "with -compare or -compare-ids: compare the batch-delivery rows instead")
	fs.BoolVar(&o.timeIDs, "time-ids", false, "message ids that sort by time (UUIDv7-shaped) instead of random ones")
	fs.Float64Var(&o.paced, "paced", 0, "run only the latency rows at this rate (msgs/s), -rounds times: the baseline and the sidecar, or with -compare the two sidecars, in turn")
	if err := fs.Parse(args); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	o.self = self
	if o.sidecar, err = filepath.Abs(o.sidecar); err != nil {
		return err
	}
	if _, err := os.Stat(o.sidecar); err != nil {
		return fmt.Errorf("sidecar binary: %w (make build)", err)
	}
	if o.profile != "" {
		if err := os.MkdirAll(o.profile, 0o755); err != nil {
			return err
		}
		o.allocs = true
	}
	switch {
	case (o.compare != "") && o.compareIDs, (o.compare != "" || o.compareIDs) && o.compareMetrics:
		return errors.New("-compare, -compare-ids, -compare-metrics: one comparison at a time")
	case o.compareIDs && o.timeIDs:
		return errors.New("-compare-ids runs both kinds of id: -time-ids has no place in it")
	case o.paced < 0:
		return errors.New("-paced: want a rate above 0 msgs/s")
	case o.paced > 0 && (o.compareIDs || o.compareMetrics || o.batch):
		return errors.New("-paced compares a baseline with a sidecar, or two sidecars (-compare): not -compare-ids, -compare-metrics or -batch")
	}
	if o.paced > 0 {
		return pacedRounds(o)
	}
	if o.compare != "" || o.compareIDs || o.compareMetrics {
		return compare(o)
	}
	started := time.Now()
	var rows []row
	var lat []latencyRow
	var costs []metricsCost

	ceils := paired(o, func(o options) (row, error) { return ceiling(o, false) }, func(o options) (row, error) { return ceiling(o, true) })
	ceil := ceils[0]
	rows = append(rows, ceils...)
	for _, c := range ceils {
		fmt.Println(c.line(ceil.rate))
	}

	add := func(r row, err error) {
		if err != nil {
			r.note = "failed: " + err.Error()
		}
		rows = append(rows, r)
		fmt.Println(r.line(ceil.rate))
	}
	if o.only != "kafka" {
		pr := paired(o, rabbitBaseline,
			func(o options) (row, error) { return rabbitSidecar(o, "batch", false, false) },
			func(o options) (row, error) { return rabbitSidecar(o, "batch", false, true) })
		base, side, batched := pr[0], pr[1], pr[2]
		add(base, nil)
		modes := []string{"batch", "none", "always"}
		if o.skipSlow {
			modes = modes[:2]
		}
		single := side.rate // the sidecar's rate with journal batch
		for _, mode := range modes {
			if mode == "batch" {
				side.vsBase = ratio(side.rate, base.rate)
				add(side, nil)
				off := o
				off.metricsOff = true
				m, err := rabbitSidecar(off, mode, false, false)
				m.vsBase = ratio(m.rate, base.rate)
				add(m, err)
				costs = append(costs, metricsCost{"RabbitMQ", side, m})
				continue
			}
			r, err := rabbitSidecar(o, mode, false, false)
			r.vsBase = ratio(r.rate, base.rate)
			add(r, err)
		}
		r, err := rabbitSidecar(o, "batch", true, false)
		add(r, err)
		batched.vsBase = ratio(batched.rate, base.rate)
		add(batched, nil)
		if base.rate > 0 {
			lat = rabbitLatencyRows(o, base.rate, single)
		}
	}
	if o.only != "rabbitmq" {
		pr := paired(o, kafkaBaseline,
			func(o options) (row, error) { return kafkaSidecar(o, "none", false, false) },
			func(o options) (row, error) { return kafkaSidecar(o, "none", false, true) })
		kbase, side, batched := pr[0], pr[1], pr[2]
		add(kbase, nil)
		orderings := []string{"none", "key", "partition"}
		if o.skipSlow {
			orderings = orderings[:2]
		}
		single := side.rate // the sidecar's rate, ordering none
		for _, ord := range orderings {
			if ord == "none" {
				side.vsBase = ratio(side.rate, kbase.rate)
				add(side, nil)
				off := o
				off.metricsOff = true
				m, err := kafkaSidecar(off, ord, false, false)
				m.vsBase = ratio(m.rate, kbase.rate)
				add(m, err)
				costs = append(costs, metricsCost{"Kafka", side, m})
				continue
			}
			r, err := kafkaSidecar(o, ord, false, false)
			r.vsBase = ratio(r.rate, kbase.rate)
			add(r, err)
		}
		if kbase.rate > 0 {
			lat = append(lat, kafkaLatencyRows(o, kbase.rate, single)...)
		}
		r, err := kafkaSidecar(o, "none", true, false)
		add(r, err)
		batched.vsBase = ratio(batched.rate, kbase.rate)
		add(batched, nil)

		// Through a share group, against a share consumer written on
		// franz-go.
		sbase, err := kafkaShareBaseline(o)
		add(sbase, err)
		r, err = kafkaShareSidecar(o)
		r.vsBase = ratio(r.rate, sbase.rate)
		add(r, err)

		// The extra column: franz-go's embedded broker, in this process.
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			add(row{name: "kfake"}, err)
		} else {
			ko := o
			ko.kafka, ko.kafkaName = cluster.ListenAddrs()[0], "kfake"
			fbase, err := kafkaBaseline(ko)
			add(fbase, err)
			r, err := kafkaSidecar(ko, "none", false, false)
			r.vsBase = ratio(r.rate, fbase.rate)
			add(r, err)
			cluster.Close()
		}
	}

	md := render(o, rows, ceil.rate, time.Since(started)) + renderTargets(rows, lat) + renderCosts(costs) + renderLatency(o, lat) + kept(o.out)
	if err := os.WriteFile(o.out, []byte(md), 0o644); err != nil {
		return err
	}
	fmt.Printf("wrote %s (%v)\n", o.out, time.Since(started).Round(time.Second))
	return nil
}

// compare runs the single-message sidecar rows of each broker (the batch
// rows with o.batch) on each side of a comparison in turn, o.rounds times: on
// a noisy machine, alternating is what makes two builds, or two kinds of
// message id, comparable.
func compare(o options) error {
	type side struct {
		tag string
		o   options
	}
	var sides []side
	switch {
	case o.compareMetrics:
		on, off := o, o
		off.metricsOff = true
		sides = []side{{"metrics on", on}, {"metrics off", off}}
	case o.compareIDs:
		random, timed := o, o
		random.timeIDs, timed.timeIDs = false, true
		sides = []side{{"random ids", random}, {"time-ordered ids", timed}}
	default:
		other, err := filepath.Abs(o.compare)
		if err != nil {
			return err
		}
		ob := o
		ob.sidecar = other
		ob.allocs = false // an earlier build may not know the flag
		sides = []side{{filepath.Base(o.sidecar), o}, {filepath.Base(other), ob}}
	}
	for round := 1; round <= o.rounds; round++ {
		for _, sd := range sidesInTurn(sides, round) {
			tag := fmt.Sprintf(" [%s, round %d]", sd.tag, round)
			sd.o.side = fmt.Sprintf("%s-%d", strings.ReplaceAll(sd.tag, " ", "-"), round)
			show := func(r row, err error) {
				if err != nil {
					r.note = "failed: " + err.Error()
				}
				r.name += tag
				fmt.Println(r.line(0))
			}
			if o.only != "kafka" {
				show(rabbitSidecar(sd.o, "batch", false, o.batch))
			}
			if o.only != "rabbitmq" {
				show(kafkaSidecar(sd.o, "none", false, o.batch))
			}
		}
	}
	return nil
}

// sidesInTurn is the order the sides run in a round: as given in odd rounds,
// reversed in even ones, so that neither side always runs first (the one
// run first met a machine that had been idle, or just busy, more often).
func sidesInTurn[T any](sides []T, round int) []T {
	if round%2 == 1 {
		return sides
	}
	out := slices.Clone(sides)
	slices.Reverse(out)
	return out
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// row is one line of the table.
type row struct {
	name    string
	rate    float64 // messages (or requests) a second
	calls   float64 // app calls per message
	cpu     float64 // CPU seconds per 10k messages, of the consumer process
	rssMB   float64 // peak RSS of the consumer process
	anonMB  float64 // peak anonymous RSS (sampled)
	vsBase  float64
	drain   time.Duration
	note    string // why the row is not a measurement (a failure), or ""
	noProcs bool   // the ceiling: no consumer process
	// perBatch is how many messages a batched request held on average: a
	// batch row that drains slowly shows whether its batches went out part
	// full. Zero for single-message rows.
	perBatch float64
	// appCPU is the app's CPU seconds per 10k requests, in a ceiling row.
	appCPU float64
	// rounds are the rates of a paired row's rounds (paired.go), and
	// roundsFailed says which failed; empty for a row run once.
	rounds       []float64
	roundsFailed string
}

func (r row) line(ceil float64) string {
	return fmt.Sprintf("%-44s %9.0f msg/s  %5.2f calls/msg  cpu %6.3fs/10k  rss %5.1fMB  anon %5.1fMB  ×base %4.2f  ×ceil %4.2f  %s",
		r.name, r.rate, r.calls, r.cpu, r.rssMB, r.anonMB, r.vsBase, ratio(r.rate, ceil), r.shownNote())
}

// shownNote is the row's note column: its note, its rounds, and the
// messages a batch.
func (r row) shownNote() string {
	var parts []string
	app := ""
	if r.appCPU > 0 {
		app = fmt.Sprintf("the app's CPU %.2f s/10k", r.appCPU)
	}
	for _, p := range []string{r.note, app, r.roundsNote()} {
		if p != "" {
			parts = append(parts, p)
		}
	}
	if r.perBatch > 0 {
		parts = append(parts, fmt.Sprintf("%.1f messages a batch", r.perBatch))
	}
	return strings.Join(parts, "; ")
}

func render(o options, rows []row, ceil float64, took time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Benchmarks\n\nMeasured by `make bench` (`cmd/handoff-bench -n %d`) on %s; the whole run took %v.\n\n",
		o.n, machine(), took.Round(time.Second))
	ids := "UUID-shaped ids, as most producers send"
	if o.timeIDs {
		ids = "UUIDv7-shaped ids, which sort by the time they were made"
	}
	b.WriteString("Every consumer drains the same preloaded backlog of 1 KiB messages (JSON with random content, which\n" +
		"Kafka's compression cannot shrink; " + ids + ") into the same app: a separate\n" +
		"process that answers each POST at once, leaving a single message's body unread and reading a batch\n" +
		"with a validating JSON parser as fast as most languages' own (fastjson). *rate* runs from the app's first call to its last new\n" +
		"success. *CPU* (rusage) and peak *RSS* (VmHWM) are the consumer process's own: the sidecar, or the hand-written\n" +
		"baseline (prefetch 256 or a poll loop, 64 workers posting over pooled keep-alive connections, ack or\n" +
		"commit on 2xx). The ceiling is the same app driven by a plain load loop of 64 workers, no broker;\n" +
		"the second ceiling sends the headers the sidecar's requests carry (CloudEvents binary mode and the\n" +
		"Handoff-* ones), which the app parses too: the floor they set under any consumer of the contract.\n" +
		"The rows the targets compare (each broker's baseline, its sidecar one message a request and in\n" +
		"batches of 64) run in turn, " + fmt.Sprint(o.rounds) + " rounds, so that the machine's drift from minute to minute falls on\n" +
		"both sides; each shows its median round, field by field, and the note lists the rounds' rates.\n" +
		"*mixed* runs answer 10% of messages 500 on their first attempt and 1% 422: *calls/msg* is the\n" +
		"amplification, and every message ends handled or dead-lettered. The *kfake* rows run on franz-go's\n" +
		"embedded broker, inside the harness process, with the data in memory. RSS counts the pages of\n" +
		"files a process maps, the sidecar's journal among them; *anon* is the peak of the rest (heap,\n" +
		"stacks, buffers), sampled every 50 ms.\n\n")
	b.WriteString("| run | msgs/s | calls/msg | CPU s / 10k msgs | peak RSS MB | peak anon MB | × baseline | × ceiling | note |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, r := range rows {
		cpu, rss, anon, vb := fmt.Sprintf("%.2f", r.cpu), fmt.Sprintf("%.1f", r.rssMB), fmt.Sprintf("%.1f", r.anonMB), fmt.Sprintf("%.2f", r.vsBase)
		if r.noProcs {
			cpu, rss, anon = "—", "—", "—"
		}
		if r.vsBase == 0 {
			vb = "—"
		}
		fmt.Fprintf(&b, "| %s | %.0f | %.2f | %s | %s | %s | %s | %.2f | %s |\n", r.name, r.rate, r.calls, cpu, rss, anon, vb, ratio(r.rate, ceil), r.shownNote())
	}
	return b.String()
}

// metricsCost pairs a sidecar run with metrics on with the same run with
// them off.
type metricsCost struct {
	broker  string
	on, off row
}

// renderCosts says what the metrics cost: CPU per message with them on
// against off, and the rates.
func renderCosts(costs []metricsCost) string {
	if len(costs) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("\n## What the metrics cost\n\nThe sidecar rows above run with their metrics on (served on `telemetry.metrics_listen`, tracing\n" +
		"off), as a scraped sidecar does; the *metrics off* rows run the same with no `metrics_listen` and no\n" +
		"OTLP endpoint, when nothing is measured. The metrics-off row runs once (the metrics-on row is the\n" +
		"median of its rounds): `handoff-bench -compare-metrics` alternates the two for several rounds.\n\n")
	b.WriteString("| broker | CPU s / 10k, on | CPU s / 10k, off | CPU per message | rate, on ÷ off |\n|---|---:|---:|---:|---:|\n")
	for _, c := range costs {
		if c.on.note != "" || c.off.note != "" || c.off.cpu == 0 || c.off.rate == 0 {
			continue
		}
		fmt.Fprintf(&b, "| %s | %.3f | %.3f | %+.1f%% | %.2f |\n", c.broker, c.on.cpu, c.off.cpu, 100*(c.on.cpu/c.off.cpu-1), c.on.rate/c.off.rate)
	}
	return b.String()
}

func renderLatency(o options, rows []latencyRow) string {
	if len(rows) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n## Latency under a paced load\n\nMessages are published at a fixed rate for %v into an empty queue or topic while the\n"+
		"consumer runs, the baseline and the sidecar in pairs at the same load: a third of the baseline's\n"+
		"drain rate above, in turn for %d rounds, each side shown as its median round; then once each at a quarter\n"+
		"of the sidecar's (with a publisher sharing the cores, half of a drain rate can already be more than a\n"+
		"consumer sustains). Latency is from publish to the app's receipt.\n\n", pacedDuration, o.rounds)
	b.WriteString("| run | paced msgs/s | p50 | p99 | note |\n|---|---:|---:|---:|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %.0f | %v | %v | %s |\n", r.name, r.rate, r.p50, r.p99, r.shownNote())
	}
	// Each baseline row is followed by the sidecar at the same load.
	for i := 0; i+1 < len(rows); i++ {
		base, side := rows[i], rows[i+1]
		if !strings.Contains(base.name, "baseline") || base.rate != side.rate || base.note != "" || side.note != "" {
			continue
		}
		broker, _, _ := strings.Cut(base.name, " ")
		fmt.Fprintf(&b, "\nAdded p99, %s at %.0f msgs/s: %v.\n", broker, base.rate, side.p99-base.p99)
	}
	return b.String()
}

func machine() string {
	cpu := "unknown CPU"
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(l, "model name") {
				cpu = strings.TrimSpace(strings.SplitN(l, ":", 2)[1])
				break
			}
		}
	}
	return fmt.Sprintf("%d cores (%s), %s/%s, %s", runtime.NumCPU(), cpu, runtime.GOOS, runtime.GOARCH, runtime.Version())
}
