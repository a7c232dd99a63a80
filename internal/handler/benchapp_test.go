package handler

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// benchAppEnv, when set, makes the test binary serve as the benchmarks' app
// instead of running tests.
const benchAppEnv = "HANDOFF_HANDLER_BENCH_APP"

func TestMain(m *testing.M) {
	if os.Getenv(benchAppEnv) != "" {
		serveBenchApp()
		return
	}
	os.Exit(m.Run())
}

// serveBenchApp answers every request at once with an empty 200, on a
// loopback port it prints, until its standard input closes: the benchmark
// that started it is gone.
func serveBenchApp() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() { _ = srv.Serve(ln) }()
	fmt.Println(ln.Addr().String())
	_, _ = io.Copy(io.Discard, os.Stdin)
	_ = srv.Close()
}

// startBenchApp runs the app in a process of its own, so that the
// benchmark's rusage, allocations and write counts are the client's alone,
// and returns its URL.
func startBenchApp(b *testing.B) string {
	b.Helper()
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), benchAppEnv+"=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Wait()
	})
	addr, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		b.Fatalf("bench app: %v", err)
	}
	return "http://" + strings.TrimSpace(addr)
}

// usage is what the process has spent so far: CPU (user+system, from
// rusage) and write and read system calls (from /proc/self/io, where the
// kernel has it).
type usage struct {
	cpu          time.Duration
	syscw, syscr int64
}

func readUsage(b *testing.B) usage {
	b.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	u := usage{cpu: time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), syscw: -1, syscr: -1}
	data, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return u
	}
	for line := range bytes.Lines(data) {
		name, v, ok := strings.Cut(strings.TrimSpace(string(line)), ": ")
		n, err := strconv.ParseInt(v, 10, 64)
		if !ok || err != nil {
			continue
		}
		switch name {
		case "syscw":
			u.syscw = n
		case "syscr":
			u.syscr = n
		}
	}
	return u
}

// reportUsage reports, per operation, the CPU and the system calls spent
// since before: CPU time rather than wall time, because on a shared machine
// wall time says more about the neighbours than about the code.
func reportUsage(b *testing.B, before usage) {
	b.Helper()
	after := readUsage(b)
	n := float64(b.N)
	b.ReportMetric(float64(after.cpu-before.cpu)/n, "cpu-ns/op")
	if before.syscw >= 0 && after.syscw >= 0 {
		b.ReportMetric(float64(after.syscw-before.syscw)/n, "syscw/op")
		b.ReportMetric(float64(after.syscr-before.syscr)/n, "syscr/op")
	}
}
