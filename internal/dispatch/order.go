package dispatch

import "sync"

// sequencer runs the walks of messages that share an order key one after
// another, in the order they were admitted. Admission happens on the source's
// delivering goroutine, so that is delivery order.
type sequencer struct {
	mu   sync.Mutex
	tail map[string]chan struct{} // closed when the key's latest walk ends
}

func newSequencer() *sequencer { return &sequencer{tail: make(map[string]chan struct{})} }

// enter queues a walk for key and returns what it must wait for (nil: nothing)
// and the func to call when it ends.
func (s *sequencer) enter(key string) (wait <-chan struct{}, leave func()) {
	mine := make(chan struct{})
	s.mu.Lock()
	prev := s.tail[key]
	s.tail[key] = mine
	s.mu.Unlock()
	return prev, func() {
		close(mine)
		s.mu.Lock()
		if s.tail[key] == mine {
			delete(s.tail, key)
		}
		s.mu.Unlock()
	}
}
