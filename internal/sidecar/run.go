package sidecar

import (
	"context"
	"fmt"
	"sync"

	"golang.org/x/sync/errgroup"

	"handoff.dev/handoff/internal/redact"
)

// part is one long-lived part of a running sidecar.
type part struct {
	name string
	run  func(ctx context.Context) error
}

// Run runs the sidecar until ctx ends, a drain is asked over HTTP, or a part
// fails; then it stops it in order and closes everything Build made,
// whatever it returns. The stop, step by step:
//
//  1. not ready: /readyz says "shutting down" from the moment ctx ends;
//  2. the engine drains: intake stops, and what is in flight is settled or
//     handed back, through the brokers;
//  3. the dead letters stop: after the drain, whose replayed copies'
//     outcomes they record, and before the brokers they record them
//     through;
//  4. the brokers' parts stop: the sources' connections and the backlog
//     readings;
//  5. the servers stop: the health server (which says "not ready" all the
//     while) and the admin API;
//  6. what the parts used is closed (see close).
//
// Each step's parts have returned before the next step begins.
func (s *Sidecar) Run(ctx context.Context) error {
	defer s.close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.drainAsked, cancel)()
	g, run := errgroup.WithContext(ctx)
	s.running.Store(&run)

	deadLetters := []part{{"dead letters", s.deadLetters.Run}}
	names := make([]string, len(s.sources))
	for i, src := range s.sources {
		names[i] = src.name
	}
	sum := summary{metrics: s.metrics, status: s.engine.Status, sources: names, log: s.log, every: summaryEvery}
	brokers := []part{{"backlog readings", s.sampler.Run}, {"traffic summary", sum.run}, {"activity history", s.activity.Run}}
	for _, src := range s.sources {
		brokers = append(brokers, part{"source " + src.name, src.run})
	}
	var servers []part
	if s.health != nil {
		servers = append(servers, part{"health server", s.health.Run})
	}
	if s.admin != nil {
		servers = append(servers, part{"admin server", s.admin.Run})
	}
	if s.part != nil {
		servers = append(servers, part{"test part", s.part})
	}
	// The stop order, steps 3 to 5.
	steps := []*step{start(g, deadLetters), start(g, brokers), start(g, servers)}

	g.Go(func() error {
		// Whatever ends the engine — ctx, another part's failure, its own
		// — the other parts stop after its drain.
		defer func() {
			for _, st := range steps {
				st.stop()
			}
		}()
		s.log.Info("sidecar running", "sources", len(s.sources), "handler", redact.URL(s.cfg.Handler.URL))
		err := s.engine.Run(run)
		close(s.drained)
		s.log.Info("intake stopped and in-flight settled; closing")
		return err
	})
	return g.Wait()
}

// step is parts that stop together: their context ends, and stop returns
// once each of them has.
type step struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// start runs parts in g until their step is stopped. A part that returns
// by itself while the sidecar runs is a failure, named in g's error.
func start(g *errgroup.Group, parts []part) *step {
	ctx, cancel := context.WithCancel(context.Background())
	st := &step{cancel: cancel}
	for _, p := range parts {
		st.wg.Add(1)
		g.Go(func() error {
			defer st.wg.Done()
			err := p.run(ctx)
			if ctx.Err() != nil || err == nil {
				return nil
			}
			return fmt.Errorf("%s: %w", p.name, err)
		})
	}
	return st
}

func (st *step) stop() {
	st.cancel()
	st.wg.Wait()
}

// close closes what Build made, once every part has stopped, in this
// order; it is also how a Build that fails gives back what it made so far.
//
//  1. the sources' clients: Kafka commits its last offsets;
//  2. the listeners of servers that never ran;
//  3. the batcher, then tracing (flushing its spans);
//  4. the dead-letter index, then the metrics (pushing the last);
//  5. the journal, last of what records, then the app client.
func (s *Sidecar) close() {
	for _, src := range s.sources {
		src.close()
	}
	if s.running.Load() == nil {
		if s.health != nil {
			_ = s.health.Close()
		}
		if s.admin != nil {
			_ = s.admin.Close()
		}
	}
	if s.batcher != nil {
		s.batcher.Close()
	}
	if s.stopTracing != nil {
		s.stopTracing()
	}
	if s.dlIndex != nil {
		_ = s.dlIndex.Close()
	}
	if s.stopMetrics != nil {
		s.stopMetrics()
	}
	if s.journal != nil {
		if err := s.journal.Close(); err != nil {
			s.log.Error("close journal", "err", err)
		}
	}
	if s.app != nil {
		s.app.Close()
	}
	s.askDrain()
}
