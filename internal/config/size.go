package config

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// ByteSize is a number of bytes, written in YAML as a whole number with a
// unit — 256MiB, 1GiB (powers of 1024; Kubernetes' 256Mi too), 500MB
// (powers of 1000) — or as a bare number of bytes.
type ByteSize int64

// sizeUnits are the units a ByteSize may be written in. A bare K, M or G is
// not one: it is 1000 to some and 1024 to others.
var sizeUnits = map[string]int64{
	"": 1, "B": 1,
	"KB": 1e3, "kB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
	"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
	"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
}

// ParseByteSize reads a size such as "256MiB", "1GiB", "500MB" or "1048576".
func ParseByteSize(s string) (ByteSize, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && t[i] >= '0' && t[i] <= '9' {
		i++
	}
	unit, ok := sizeUnits[strings.TrimSpace(t[i:])]
	if i == 0 || !ok {
		return 0, fmt.Errorf("invalid size %q: want a whole number and a unit, such as 256MiB, 1GiB or 500MB", s)
	}
	n, err := strconv.ParseInt(t[:i], 10, 64)
	if err != nil || n > math.MaxInt64/unit {
		return 0, fmt.Errorf("invalid size %q: too large", s)
	}
	return ByteSize(n * unit), nil
}

// UnmarshalYAML accepts a size string or a bare number of bytes.
func (b *ByteSize) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode || (n.Tag != "!!str" && n.Tag != "!!int") {
		return fmt.Errorf("invalid size %q: want a whole number and a unit, such as 256MiB, 1GiB or 500MB", n.Value)
	}
	v, err := ParseByteSize(n.Value)
	if err != nil {
		return err
	}
	*b = v
	return nil
}

// MarshalYAML writes b back as String does.
func (b ByteSize) MarshalYAML() (any, error) { return b.String(), nil }

// String writes b in the largest binary unit that divides it: 256MiB.
func (b ByteSize) String() string {
	for _, u := range []string{"TiB", "GiB", "MiB", "KiB"} {
		if m := sizeUnits[u]; b != 0 && int64(b)%m == 0 {
			return strconv.FormatInt(int64(b)/m, 10) + u
		}
	}
	return strconv.FormatInt(int64(b), 10) + "B"
}
