package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// The failure mix is what the mixed columns claim: about 1% poison and 10%
// transient, the transient ones failing only their first attempt, and the
// same answer every time for the same id.
func TestAnswerMix(t *testing.T) {
	const n = 20000
	poison, transient := 0, 0
	for i := range n {
		id := msgID(i)
		switch answer(id, 1, true) {
		case http.StatusUnprocessableEntity:
			poison++
			if answer(id, 2, true) != http.StatusUnprocessableEntity {
				t.Fatalf("%s: poison only on its first attempt", id)
			}
		case http.StatusInternalServerError:
			transient++
			if answer(id, 2, true) != http.StatusOK {
				t.Fatalf("%s: transient failure repeated on the second attempt", id)
			}
		}
		if answer(id, 1, false) != http.StatusOK {
			t.Fatalf("%s failed with the mix off", id)
		}
	}
	if p := float64(poison) / n; p < 0.005 || p > 0.02 {
		t.Errorf("poison share %.3f, want about 0.01", p)
	}
	if p := float64(transient) / n; p < 0.08 || p > 0.12 {
		t.Errorf("transient share %.3f, want about 0.10", p)
	}
}

// Message ids are unique, UUID-shaped, and not in counting order.
func TestMsgIDs(t *testing.T) {
	seen := map[string]bool{}
	ordered := 0
	prev := ""
	for i := range 100000 {
		id := msgID(i)
		if len(id) != 36 || id[14] != '4' || seen[id] {
			t.Fatalf("msgID(%d) = %q: not a fresh UUID-shaped id", i, id)
		}
		seen[id] = true
		if id > prev {
			ordered++
		}
		prev = id
	}
	if ordered > 55000 || ordered < 45000 {
		t.Errorf("%d of 100000 ids sort after the one before: not scattered", ordered)
	}
}

// Time-ordered ids are unique, UUIDv7-shaped, and sort by the millisecond
// they were made in, whatever the order within one.
func TestTimeIDs(t *testing.T) {
	seen := map[string]bool{}
	base := time.UnixMilli(1_780_000_000_000)
	prevMax := "" // the largest id of the milliseconds before
	for ms := range 1000 {
		at := base.Add(time.Duration(ms) * time.Millisecond)
		curMax := prevMax
		for k := range 50 {
			i := ms*50 + k
			id := timeID(i, at)
			if len(id) != 36 || id[14] != '7' || !strings.ContainsRune("89ab", rune(id[19])) || seen[id] {
				t.Fatalf("timeID(%d) = %q: not a fresh UUIDv7-shaped id", i, id)
			}
			seen[id] = true
			curMax = max(curMax, id)
			if id <= prevMax {
				t.Fatalf("timeID(%d) = %q sorts before an id of an earlier millisecond, %q", i, id, prevMax)
			}
		}
		prevMax = curMax
	}
	if ms := timeID(0, base)[:13]; ms != fmt.Sprintf("%08x-%04x", uint64(base.UnixMilli())>>16, uint64(base.UnixMilli())&0xffff) {
		t.Errorf("id starts %q: not the millisecond it was made in", ms)
	}
}

func TestRenderNamesEveryRun(t *testing.T) {
	rows := []row{{name: "ceiling", rate: 1000, calls: 1, noProcs: true}, {name: "sidecar", rate: 500, calls: 1.1, cpu: 2, rssMB: 40, anonMB: 25, vsBase: 0.5}}
	if md := render(options{n: 10, timeIDs: true}, rows, 1000, 0); !strings.Contains(md, "UUIDv7-shaped ids") {
		t.Error("a run with time-ordered ids does not say so")
	}
	md := render(options{n: 10}, rows, 1000, 0)
	for _, want := range []string{"| ceiling | 1000 | 1.00 | — | — | — | — | 1.00 |", "| sidecar | 500 | 1.10 | 2.00 | 40.0 | 25.0 | 0.50 | 0.50 |"} {
		if !strings.Contains(md, want) {
			t.Errorf("table lacks %q:\n%s", want, md)
		}
	}
}

// The peak RSS of a consumer is its own, not the harness's: a waited-for
// child's rusage maxrss starts at the size of the process that forked it.
func TestPeakRSSIsTheChildsOwn(t *testing.T) {
	ballast := make([]byte, 128<<20)
	for i := range ballast {
		ballast[i] = 1
	}
	// Start returns once the child has exec'd sleep, so what /proc reads
	// is sleep's own; sleep lasts until the test is done with it, so that
	// a slow read never finds it gone.
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	kib, err := peakRSS(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if kib <= 0 || kib > 32<<10 {
		t.Fatalf("sleep's peak RSS read as %d KiB (the harness holds %d MiB)", kib, len(ballast)>>20)
	}
	runtime.KeepAlive(ballast)
}

// The sampled anonymous peak sees memory a consumer touched and let go.
func TestSampleAnonSeesAPeak(t *testing.T) {
	if os.Getenv("HANDOFF_BENCH_ALLOC_CHILD") != "" {
		b := make([]byte, 96<<20)
		for i := range b {
			b[i] = 1
		}
		// The consumer holds it a while: long enough for a sampler ticking
		// every 50ms to see it on a loaded machine.
		time.Sleep(time.Second)
		runtime.KeepAlive(b)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSampleAnonSeesAPeak$")
	cmd.Env = append(os.Environ(), "HANDOFF_BENCH_ALLOC_CHILD=1")
	done := make(chan struct{})
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	peak := sampleAnon(cmd.Process.Pid, done)
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	close(done)
	if kib := peak(); kib < 90<<10 {
		t.Errorf("peak anonymous memory read as %d KiB, want at least the 96 MiB the child held", kib)
	}
}

// The targets table reads each goal against the run's rows: met, missed by
// how much, or not measured when the run left the row out.
func TestTargets(t *testing.T) {
	rows := []row{
		{name: "RabbitMQ baseline (hand-written amqp091-go)", rate: 10000, cpu: 0.5, rssMB: 20, anonMB: 8},
		{name: "RabbitMQ sidecar, journal batch", rate: 9000, cpu: 1.0, rssMB: 40, anonMB: 30},
		{name: "RabbitMQ sidecar, journal batch, batches of 64", rate: 16000},
		{name: "Kafka baseline (hand-written franz-go)", rate: 20000, cpu: 0.4, rssMB: 60, anonMB: 50},
		{name: "Kafka sidecar, ordering none, journal batch", rate: 10000, cpu: 0.5, rssMB: 96, anonMB: 60},
		{name: "Kafka sidecar, ordering none, journal batch, batches of 64", rate: 5000, note: "failed: gone"},
	}
	lat := []latencyRow{
		{name: "RabbitMQ baseline (hand-written amqp091-go), a third of its drain rate", rate: 3333, p99: 20 * time.Millisecond},
		{name: "RabbitMQ sidecar, journal batch, same load", rate: 5000, p99: 25 * time.Millisecond},
	}
	want := map[string]string{
		"RabbitMQ, one message a request, rate":                       "met",
		"Kafka, one message a request, rate":                          "missed: 59% of it",
		"RabbitMQ, CPU per message":                                   "missed: 1.5× the bound",
		"Kafka, CPU per message":                                      "met",
		"RabbitMQ, batches of 64, rate":                               "met",
		"Kafka, batches of 64, rate":                                  "not measured",
		"RabbitMQ, added p99 at a third of the baseline's drain rate": "met",
		"Kafka, added p99 at a third of the baseline's drain rate":    "not measured",
		"RabbitMQ, peak RSS over the baseline's":                      "met",
		"RabbitMQ, peak anon over the baseline's":                     "missed: 1.4× the bound",
		"Kafka, peak RSS over the baseline's":                         "missed: 1.1× the bound",
		"Kafka, peak anon over the baseline's":                        "met",
	}
	got := targets(rows, lat)
	if len(got) != len(want) {
		t.Fatalf("%d targets, want %d", len(got), len(want))
	}
	for _, tg := range got {
		if w, ok := want[tg.what]; !ok || tg.verdict() != w {
			t.Errorf("%s: %q, want %q", tg.what, tg.verdict(), w)
		}
	}
}

// The hand-written part of BENCH.md, from its marker on, survives a rewrite.
func TestKeptPart(t *testing.T) {
	path := t.TempDir() + "/BENCH.md"
	if kept(path) != "" {
		t.Fatal("a missing file kept something")
	}
	tail := keptMarker + "\n\n## Profiles\n\nby hand\n"
	if err := os.WriteFile(path, []byte("# Benchmarks\n\ngenerated\n\n"+tail), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := kept(path); got != "\n"+tail {
		t.Errorf("kept = %q, want %q", got, "\n"+tail)
	}
	if err := os.WriteFile(path, []byte("# Benchmarks\n\nno marker\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := kept(path); got != "" {
		t.Errorf("kept without a marker = %q", got)
	}
}

func TestSlowestBySecond(t *testing.T) {
	s := int64(time.Second)
	arrived := []int64{10 * s, 10*s + 1, 11*s + 5, 13 * s}
	lat := []int64{4000, 250_000, 9000, 1500}
	got := slowestBySecond(arrived, lat)
	want := []int64{250, 9, 0, 1}
	if !slices.Equal(got, want) {
		t.Errorf("slowestBySecond = %v, want %v", got, want)
	}
	if got := slowestBySecond(nil, nil); got != nil {
		t.Errorf("no arrivals: %v, want none", got)
	}
}

// A paired row shows its median round, field by field, leaves failed rounds
// out and names them, and lists the rounds' rates; the targets read it as a
// measurement.
func TestMedianOfRounds(t *testing.T) {
	rounds := []row{
		{name: "Kafka sidecar, ordering none, journal batch", rate: 30000, cpu: 0.30, rssMB: 90, anonMB: 50, calls: 1},
		{name: "Kafka sidecar, ordering none, journal batch", note: "failed: consumer exited"},
		{name: "Kafka sidecar, ordering none, journal batch", rate: 20000, cpu: 0.40, rssMB: 80, anonMB: 60, calls: 1},
		{name: "Kafka sidecar, ordering none, journal batch", rate: 25000, cpu: 0.20, rssMB: 100, anonMB: 55, calls: 1},
	}
	m := median(rounds)
	if m.rate != 25000 || m.cpu != 0.30 || m.rssMB != 90 || m.anonMB != 55 || m.note != "" {
		t.Errorf("median = %+v, want rate 25000, cpu 0.30, rss 90, anon 55 and no note", m)
	}
	note := m.shownNote()
	for _, want := range []string{"median of 3 rounds (30000, 20000, 25000 msg/s)", "1 of 4 rounds failed (failed: consumer exited)"} {
		if !strings.Contains(note, want) {
			t.Errorf("note %q lacks %q", note, want)
		}
	}
	if got := medianOf([]float64{4, 1, 3, 2}, func(v float64) float64 { return v }); got != 2.5 {
		t.Errorf("median of an even count = %v, want 2.5", got)
	}
	if f := median(rounds[1:2]); f.note == "" {
		t.Error("a row whose every round failed lost its failure")
	}
	if one := median(rounds[:1]); one.shownNote() != "" {
		t.Errorf("a row run once shows %q", one.shownNote())
	}

	lat := medianLatency([]latencyRow{
		{name: "Kafka baseline", p50: 3 * time.Millisecond, p99: 40 * time.Millisecond},
		{name: "Kafka baseline", p50: 5 * time.Millisecond, p99: 900 * time.Millisecond},
		{name: "Kafka baseline", p50: 4 * time.Millisecond, p99: 20 * time.Millisecond},
	})
	if lat.p50 != 4*time.Millisecond || lat.p99 != 40*time.Millisecond || lat.note != "" {
		t.Errorf("paced median = %+v, want p50 4ms, p99 40ms, no note", lat)
	}
	if want := "median of 3 rounds (p99 40ms, 900ms, 20ms)"; lat.shownNote() != want {
		t.Errorf("paced note %q, want %q", lat.shownNote(), want)
	}
}

// The contract's cost to the app is read from the two ceilings, and left
// out when either is missing.
func TestContractCost(t *testing.T) {
	rows := []row{
		{name: "ceiling: load loop → app (no broker)", rate: 30000, appCPU: 0.25},
		{name: "ceiling, the sidecar's headers: load loop → app (no broker)", rate: 27000, appCPU: 0.30},
	}
	got := contractCost(rows)
	for _, want := range []string{"0.90× the one without", "+20% (0.30 against 0.25 s/10k)"} {
		if !strings.Contains(got, want) {
			t.Errorf("%q lacks %q", got, want)
		}
	}
	if got := contractCost(rows[:1]); got != "" {
		t.Errorf("with one ceiling: %q", got)
	}
}

// Rows run in turn, A B A B, each knowing its round (the profiles' names),
// and only several rounds are shown one by one.
func TestInTurn(t *testing.T) {
	var order []string
	run := func(tag string) func(options) string {
		return func(o options) string { order = append(order, tag+o.side); return tag + o.side }
	}
	shown := 0
	got := inTurn(options{rounds: 2}, []func(options) string{run("a"), run("b")}, func(string, int) { shown++ })
	if want := []string{"around-1", "bround-1", "around-2", "bround-2"}; !slices.Equal(order, want) {
		t.Errorf("order %v, want %v", order, want)
	}
	if len(got) != 2 || !slices.Equal(got[0], []string{"around-1", "around-2"}) || !slices.Equal(got[1], []string{"bround-1", "bround-2"}) {
		t.Errorf("results %v", got)
	}
	if shown != 4 {
		t.Errorf("%d rounds shown, want 4", shown)
	}
	shown = 0
	if one := inTurn(options{rounds: 1}, []func(options) string{run("c")}, func(string, int) { shown++ }); !slices.Equal(one[0], []string{"c"}) || shown != 0 {
		t.Errorf("one round: %v, %d shown; want [c] and none shown", one, shown)
	}
}

// -compare's sides take turns going first: round 1 as given, round 2
// reversed, and so on.
func TestCompareSidesTakeTurns(t *testing.T) {
	sides := []string{"new", "old"}
	for round, want := range map[int]string{1: "new old", 2: "old new", 3: "new old", 4: "old new"} {
		if got := strings.Join(sidesInTurn(sides, round), " "); got != want {
			t.Errorf("round %d runs %q, want %q", round, got, want)
		}
	}
	if strings.Join(sides, " ") != "new old" {
		t.Errorf("sidesInTurn changed its argument: %v", sides)
	}
}

// The app reads a batch as the sidecar writes it — events with JSON data,
// escaped ids, attempts as strings — and answers each id, escaped again.
func TestAppReadsABatch(t *testing.T) {
	batch := `[{"specversion":"1.0","id":"a\"1\u00e9","source":"s","type":"t","handoffattempt":"2",` +
		`"datacontenttype":"application/json","data":{"n":[1,2,{"x":"y"}]}},` +
		`{"id":"b","handoffattempt":"1","data_base64":"AAE="}]`
	events, err := readBatch(strings.NewReader(batch))
	if err != nil {
		t.Fatal(err)
	}
	want := []batchEvent{{id: "a\"1é", attempt: 2}, {id: "b", attempt: 1}}
	if !slices.Equal(events, want) {
		t.Fatalf("read %+v, want %+v", events, want)
	}
	out := appendResults(nil, events, func(id string, attempt int) int { return 200 + attempt })
	var answer struct {
		Results []struct {
			ID     string `json:"id"`
			Status int    `json:"status"`
		} `json:"results"`
	}
	if err := json.Unmarshal(out, &answer); err != nil {
		t.Fatalf("answer %s: %v", out, err)
	}
	if len(answer.Results) != 2 || answer.Results[0].ID != "a\"1é" || answer.Results[0].Status != 202 || answer.Results[1].Status != 201 {
		t.Fatalf("answer %s", out)
	}
	for _, bad := range []string{`[{"id":"a"`, `{"id":"a"}`, `[{"id":"a"}] x`} {
		if _, err := readBatch(strings.NewReader(bad)); err == nil {
			t.Errorf("%s read without error", bad)
		}
	}
}
