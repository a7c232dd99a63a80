package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The processes a run measures: started, stopped, and their memory read
// from /proc.

// proc is a running consumer process with its output kept for errors.
type proc struct {
	cmd  *exec.Cmd
	logs bytes.Buffer
	done chan struct{} // closed once it exited
}

func startProc(cmd *exec.Cmd) (*proc, error) {
	p := &proc{cmd: cmd, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &p.logs, &p.logs
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p, nil
}

// stop asks the process to exit and waits for it, killing it after 30s.
func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// peakRSS reads a running process's peak resident set (VmHWM), in KiB.
// The rusage of a waited-for child is no good for this: its maxrss starts
// at the resident size of the process that forked it (the harness), which
// it keeps until exec.
func peakRSS(pid int) (int64, error) { return statusKiB(pid, "VmHWM") }

// statusKiB reads one of a process's memory figures from /proc, in KiB.
func statusKiB(pid int, field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
		}
	}
	return 0, fmt.Errorf("no %s in /proc status", field)
}

// sampleAnon samples a process's anonymous resident memory (heap, stacks:
// what RSS counts besides the file pages it maps, such as the journal's)
// every 50ms until it exits or the returned function is called, which
// returns the peak seen, in KiB. The kernel keeps no peak of it.
func sampleAnon(pid int, exited <-chan struct{}) func() int64 {
	stop := make(chan struct{})
	peak := make(chan int64, 1)
	go func() {
		var hi int64
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			if v, err := statusKiB(pid, "RssAnon"); err == nil {
				hi = max(hi, v)
			}
			select {
			case <-t.C:
			case <-stop:
				peak <- hi
				return
			case <-exited:
				peak <- hi
				return
			}
		}
	}()
	return func() int64 {
		close(stop)
		return <-peak
	}
}

func tail(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return strings.Join(lines, " | ")
}
