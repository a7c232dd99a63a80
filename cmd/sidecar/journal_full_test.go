package main

import (
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"handoff.dev/handoff/internal/broker/brokertest"
	"handoff.dev/handoff/internal/broker/rabbitmq"
	"handoff.dev/handoff/internal/testkit"
)

// boltHighWater is the end of the pages a bbolt file uses, in bytes, read
// from its newer meta page: past it, a commit writes new pages.
func boltHighWater(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	head := make([]byte, 64<<10)
	if _, err := io.ReadFull(f, head); err != nil {
		t.Fatal(err)
	}
	pageSize := int64(binary.LittleEndian.Uint32(head[24:]))
	var best, hwm uint64
	for _, at := range []int64{0, pageSize} {
		m := head[at:]
		if txid := binary.LittleEndian.Uint64(m[64:]); txid >= best {
			best, hwm = txid, binary.LittleEndian.Uint64(m[56:])
		}
	}
	return int64(hwm) * pageSize
}

// setFileLimit sets the file size limit of process pid (RLIMIT_FSIZE).
func setFileLimit(t *testing.T, pid int, limit uint64) {
	t.Helper()
	if err := unix.Prlimit(pid, unix.RLIMIT_FSIZE, &unix.Rlimit{Cur: limit, Max: unix.RLIM_INFINITY}, nil); err != nil {
		t.Fatalf("prlimit: %v", err)
	}
}

// TestJournalFullPausesIntake runs the real binary and takes the room from
// its journal while messages flow: a file size limit just past the pages
// it uses makes its commits fail (EFBIG, as a full disk's fail with
// ENOSPC). Intake waits, /readyz and the metrics say why, and no delivery
// is acked whose outcome could not be written; once there is room again,
// every message is handled and none is lost or dead-lettered.
func TestJournalFullPausesIntake(t *testing.T) {
	t.Parallel()
	bin := sidecarBinary(t)
	conn := dialRabbit(t)
	q := testQueue(t, conn, []time.Duration{tier})
	var mu sync.Mutex
	handled := map[string]int{}
	unflagged := 0 // calls after the first of an id that do not say redelivered
	a := newApp(t, func(w http.ResponseWriter, c call, _ []call) {
		mu.Lock()
		id := c.Header.Get("Ce-Id")
		if handled[id]++; handled[id] > 1 && c.Header.Get("Handoff-Redelivered") != "true" {
			unflagged++
		}
		mu.Unlock()
		w.WriteHeader(http.StatusOK)
	})
	dir := t.TempDir()
	jpath := filepath.Join(dir, "handoff.db")
	path := writeFile(t, fmt.Sprintf(`handler: {url: %q, max_concurrency: 8}
sources:
  - name: full
    rabbitmq: {url: %q, queue: %q, prefetch: 8}
retry: {tiers: [1s]}
telemetry: {metrics_listen: "127.0.0.1:0"}
journal: {path: %q}
`, a.url(), brokertest.RabbitURL(), q, jpath))
	r := startBinary(t, bin, path)
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(handled)
	}

	publishN := func(from, n int) {
		var msgs []publishing
		for i := range n {
			msgs = append(msgs, publishing{MessageId: fmt.Sprintf("j-%d", from+i), Body: []byte("x")})
		}
		publish(t, conn, q, msgs...)
	}
	publishN(0, 50)
	testkit.Eventually(t, 15*time.Second, "the first messages handled", func() bool { return count() == 50 && depth(t, conn, q) == 0 })

	// No room: the file may not grow past the pages in use and a little.
	setFileLimit(t, r.cmd.Process.Pid, uint64(boltHighWater(t, jpath)+16<<10))
	const total = 1500
	publishN(50, total-50)
	testkit.Eventually(t, 30*time.Second, "/readyz to say the journal has no room", func() bool {
		_, readyz := healthBodies(t, r.health)
		return strings.Contains(readyz, "journal: journal: no room to write")
	})
	// Near the limit a commit that reuses freed pages can succeed and reopen
	// intake for a moment, so the gauge is read until it says so.
	testkit.Eventually(t, 30*time.Second, "/metrics to say handoff_journal_writable 0", func() bool {
		return sample(scrape(t, r.health), "handoff_journal_writable", nil) == 0
	})
	held := count()
	if held >= total {
		t.Fatalf("every message was handled with the journal full (%d)", held)
	}
	if !strings.Contains(r.log.String(), "journal cannot be written") {
		t.Error("the log does not say the journal cannot be written")
	}

	// Room again: every message is handled, the queue drains.
	setFileLimit(t, r.cmd.Process.Pid, unix.RLIM_INFINITY)
	testkit.Eventually(t, 60*time.Second, "every message handled once there is room", func() bool {
		return count() == total && depth(t, conn, q) == 0
	})
	_, readyz := healthBodies(t, r.health)
	if !strings.HasPrefix(readyz, "200 ") {
		t.Errorf("/readyz after the room came back: %q", readyz)
	}
	if n := len(readStream(t, conn, rabbitmq.DeadLetterQueue(q))); n != 0 {
		t.Errorf("%d dead letters, want none", n)
	}
	r.stop(t)
	// Every message acked is written down as handled: the journal holds a
	// settled hand-off for each.
	out, err := runCLI(t, "journal", "events", "--path", jpath)
	if err != nil {
		t.Fatalf("journal events: %v\n%s", err, out)
	}
	for i := range total {
		if id := fmt.Sprintf("j-%d", i); !strings.Contains(out, id) {
			t.Errorf("the journal has no hand-off of %s", id)
			break
		}
	}
	n := calls(&mu, handled)
	t.Logf("%d handled before intake paused; %d calls in all for %d messages", held, n, total)
	// A call whose answer could not be written is made again, flagged: no
	// more of those than deliveries were taken when intake paused (a
	// prefetch of 8 on the queue and on its retry queue), each time it
	// paused. Near the limit, a commit that reuses freed pages can succeed
	// and open the gate while the next one, needing new pages, fails.
	pauses := strings.Count(r.log.String(), "journal cannot be written: intake paused")
	if pauses == 0 {
		t.Error("the log never says intake paused for the journal")
	}
	if n-total > 16*pauses {
		t.Errorf("%d calls for %d messages over %d pauses: more repeats than deliveries taken", n, total, pauses)
	}
	t.Logf("intake paused %d times for the journal", pauses)
	mu.Lock()
	defer mu.Unlock()
	if unflagged > 0 {
		t.Errorf("%d repeated calls did not say Handoff-Redelivered: true", unflagged)
	}
}

func calls(mu *sync.Mutex, m map[string]int) int {
	mu.Lock()
	defer mu.Unlock()
	n := 0
	for _, c := range m {
		n += c
	}
	return n
}
