package telemetry

import (
	"math"
	"sync"
	"time"
)

// A backlog B with arrivals λ and completions μ drains in B/(μ−λ), and never
// when μ ≤ λ (seed 000). Drain estimates λ and μ for one source from
// readings taken at intervals over a sliding window, and the drain time
// from the last backlog.
//
// μ is the rate of messages taken from the source (fresh ones, not retry
// copies: those are not in the source's backlog): the group's, from its
// committed offsets, on Kafka; this replica's on RabbitMQ. λ is the rate of
// messages produced to the source: from the log's end offsets where the
// broker says (Kafka), otherwise μ + dB/dt (RabbitMQ: what arrived is what
// was taken plus what the backlog grew by). With several replicas on
// RabbitMQ, λ and μ are each one replica's view, but μ−λ = −dB/dt is the
// queue's, and so is the drain time.
type Drain struct {
	window time.Duration

	mu      sync.Mutex
	samples []DrainSample
}

// DrainSample is one reading of a source.
type DrainSample struct {
	At time.Time
	// Backlog is the messages waiting: the Kafka group's lag on the source
	// topic, or the RabbitMQ source queue's ready count.
	Backlog int64
	// Taken counts the fresh messages the sidecar took, since its start.
	Taken int64
	// Produced counts the messages produced to the source (the sum of its
	// partitions' end offsets), when ProducedKnown.
	Produced      int64
	ProducedKnown bool
}

// DefaultDrainWindow is the window the rates are taken over: long enough
// to smooth a consumer's fetches and an app's pauses, short enough to show
// a change within a minute.
const DefaultDrainWindow = time.Minute

// NewDrain returns an estimator over window (DefaultDrainWindow when 0).
func NewDrain(window time.Duration) *Drain {
	if window <= 0 {
		window = DefaultDrainWindow
	}
	return &Drain{window: window}
}

// Add records a reading; readings older than the window before it are
// dropped, but the last one before the window is kept as its start.
func (d *Drain) Add(s DrainSample) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.samples = append(d.samples, s)
	cut := 0
	for cut+1 < len(d.samples) && s.At.Sub(d.samples[cut+1].At) >= d.window {
		cut++
	}
	d.samples = d.samples[cut:]
}

// Estimate is what the readings say of a source.
type Estimate struct {
	Backlog float64
	// Arrival (λ) and Completion (μ) are per second.
	Arrival, Completion float64
	// Drain is B/(μ−λ) in seconds: +Inf when μ ≤ λ and a backlog is
	// waiting ("not converging"), 0 with no backlog.
	Drain float64
}

// Estimate returns the estimate over the window, and false until two
// readings span some time.
func (d *Drain) Estimate() (Estimate, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.samples) < 2 {
		return Estimate{}, false
	}
	first, last := d.samples[0], d.samples[len(d.samples)-1]
	dt := last.At.Sub(first.At).Seconds()
	if dt <= 0 {
		return Estimate{}, false
	}
	e := Estimate{Backlog: float64(last.Backlog), Completion: float64(last.Taken-first.Taken) / dt}
	if first.ProducedKnown && last.ProducedKnown {
		e.Arrival = float64(last.Produced-first.Produced) / dt
	} else {
		e.Arrival = max(e.Completion+float64(last.Backlog-first.Backlog)/dt, 0)
	}
	e.Drain = DrainTime(e.Backlog, e.Arrival, e.Completion)
	return e, true
}

// DrainTime is B/(μ−λ): how long a backlog b takes to drain with arrivals
// lambda and completions mu a second; +Inf when mu ≤ lambda (it never
// drains), 0 when there is no backlog.
func DrainTime(b, lambda, mu float64) float64 {
	if b <= 0 {
		return 0
	}
	if mu <= lambda {
		return math.Inf(1)
	}
	return b / (mu - lambda)
}
