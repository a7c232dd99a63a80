package journal

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// unmapFile removes every mapping of the file at path from this process.
// bbolt maps the file before it reads its pages; when reading them panics,
// the mapping stays, and since a mapping holds the file's open description,
// so does its lock: a later Open in this process would find the file
// locked. It reads the mappings from /proc/self/maps; where there is none
// (not Linux), it does nothing.
func unmapFile(path string) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return
	}
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return
	}
	var ranges [][2]uintptr
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasSuffix(line, " "+abs) {
			continue
		}
		span, _, _ := strings.Cut(line, " ")
		lo, hi, ok := strings.Cut(span, "-")
		if !ok {
			continue
		}
		a, err1 := strconv.ParseUint(lo, 16, 64)
		b, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 == nil && err2 == nil && b > a {
			ranges = append(ranges, [2]uintptr{uintptr(a), uintptr(b - a)})
		}
	}
	_ = f.Close()
	for _, r := range ranges {
		_, _, _ = syscall.Syscall(syscall.SYS_MUNMAP, r[0], r[1], 0)
	}
}
