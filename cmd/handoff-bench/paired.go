package main

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// The rows the targets compare — a baseline, the sidecar one message a
// request, the sidecar in batches, and the first paced pair — are run in
// turn, o.rounds times (A B C, A B C, …), and each is shown as its median
// round. On a machine whose CPU speed drifts by a fifth from one minute to
// the next (the app's own work, the same in every run, took 17–25% more
// CPU in some drains than in others), a baseline measured once a minute
// before the sidecar makes its ratio a reading of the drift; in turns, both
// sides see the same stretches, and a median leaves out the one round a
// stall spoilt on either side.

// run is one measurement of a paired row: o carries the round, for the
// profiles' names.
type run func(o options) (row, error)

// paired runs runs in turn, o.rounds times, printing each round's line,
// and returns each one's median row.
func paired(o options, runs ...run) []row {
	each := make([]func(options) row, len(runs))
	for i, fn := range runs {
		each[i] = func(o options) row {
			r, err := fn(o)
			if err != nil {
				r.note = "failed: " + err.Error()
			}
			return r
		}
	}
	rounds := inTurn(o, each, func(r row, round int) {
		r.name += fmt.Sprintf(" [round %d]", round)
		fmt.Println(r.line(0))
	})
	out := make([]row, len(runs))
	for i, rs := range rounds {
		out[i] = median(rs)
	}
	return out
}

// inTurn runs runs in turn, o.rounds times (A B C, A B C, …), each with its
// round in its options (the profiles' names), shows each result with its
// round when there is more than one, and returns each run's results in
// round order.
func inTurn[T any](o options, runs []func(options) T, show func(r T, round int)) [][]T {
	out := make([][]T, len(runs))
	for round := 1; round <= max(o.rounds, 1); round++ {
		ro := o
		if o.rounds > 1 {
			ro.side = fmt.Sprintf("round-%d", round)
		}
		for i, fn := range runs {
			r := fn(ro)
			out[i] = append(out[i], r)
			if o.rounds > 1 {
				show(r, round)
			}
		}
	}
	return out
}

// median is a row's median round, field by field. Failed rounds are left
// out, and named in the note; with none left, the first failure stands.
func median(rounds []row) row {
	var ok []row
	var failed []string
	for _, r := range rounds {
		if r.note == "" && r.rate > 0 {
			ok = append(ok, r)
		} else {
			failed = append(failed, r.note)
		}
	}
	if len(ok) == 0 {
		return rounds[0]
	}
	if len(rounds) == 1 {
		return ok[0]
	}
	m := ok[0]
	m.rate = medianOf(ok, func(r row) float64 { return r.rate })
	m.calls = medianOf(ok, func(r row) float64 { return r.calls })
	m.cpu = medianOf(ok, func(r row) float64 { return r.cpu })
	m.rssMB = medianOf(ok, func(r row) float64 { return r.rssMB })
	m.anonMB = medianOf(ok, func(r row) float64 { return r.anonMB })
	m.perBatch = medianOf(ok, func(r row) float64 { return r.perBatch })
	m.appCPU = medianOf(ok, func(r row) float64 { return r.appCPU })
	m.drain = time.Duration(medianOf(ok, func(r row) float64 { return float64(r.drain) }))
	for _, r := range ok {
		m.rounds = append(m.rounds, r.rate)
	}
	if len(failed) > 0 {
		m.roundsFailed = fmt.Sprintf("%d of %d rounds failed (%s)", len(failed), len(rounds), strings.Join(failed, "; "))
	}
	return m
}

// medianOf is the median of f over rows; of an even count, the mean of the
// middle two.
func medianOf[T any](rows []T, f func(T) float64) float64 {
	v := make([]float64, len(rows))
	for i, r := range rows {
		v[i] = f(r)
	}
	slices.Sort(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

// roundsNote lists a median row's rounds: their rates, and any that failed.
func (r row) roundsNote() string {
	if len(r.rounds) == 0 {
		return r.roundsFailed
	}
	rates := make([]string, len(r.rounds))
	for i, v := range r.rounds {
		rates[i] = fmt.Sprintf("%.0f", v)
	}
	s := fmt.Sprintf("median of %d rounds (%s msg/s)", len(r.rounds), strings.Join(rates, ", "))
	if r.roundsFailed != "" {
		s += "; " + r.roundsFailed
	}
	return s
}
