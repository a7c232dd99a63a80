package handler

import (
	"time"

	"handoff.dev/handoff/internal/broker"
)

// appendTime appends t as broker.TimeLayout writes it in UTC
// (2006-01-02T15:04:05.000Z). Every call formats its deadline this way, and
// time.Time.AppendFormat, which reads the layout anew each time, was two
// fifths of the CPU spent on a call's headers. Years that do not take four
// digits are left to AppendFormat.
func appendTime(b []byte, t time.Time) []byte {
	t = t.UTC()
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		return t.AppendFormat(b, broker.TimeLayout)
	}
	// The time of day from the seconds since the epoch, which are UTC's:
	// cheaper than t.Clock, which works out the date again.
	sod := int(t.Unix() % 86400)
	if sod < 0 {
		sod += 86400
	}
	ms := t.Nanosecond() / int(time.Millisecond) // truncated, as AppendFormat does
	d := [...]byte{
		0, 0, 0, 0, '-', 0, 0, '-', 0, 0, 'T', 0, 0, ':', 0, 0, ':', 0, 0, '.', 0, 0, 0, 'Z',
	}
	put2(d[0:2], year/100)
	put2(d[2:4], year%100)
	put2(d[5:7], int(month))
	put2(d[8:10], day)
	put2(d[11:13], sod/3600)
	put2(d[14:16], sod/60%60)
	put2(d[17:19], sod%60)
	d[20] = byte('0' + ms/100)
	put2(d[21:23], ms%100)
	return append(b, d[:]...)
}

// put2 writes v, from 0 to 99, as two digits.
func put2(d []byte, v int) {
	d[0] = byte('0' + v/10)
	d[1] = byte('0' + v%10)
}
