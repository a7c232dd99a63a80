package broker

import (
	"strconv"
	"time"
)

// TierName is the short form of a delay tier used in queue and topic names:
// 1s, 10s, 1m, 1h30m, 250ms — never Go's "1m0s".
func TierName(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	if d%time.Second != 0 {
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	}
	var out []byte
	for _, u := range []struct {
		unit time.Duration
		name string
	}{{time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}} {
		if n := d / u.unit; n > 0 {
			out = strconv.AppendInt(out, int64(n), 10)
			out = append(out, u.name...)
			d -= n * u.unit
		}
	}
	return string(out)
}
