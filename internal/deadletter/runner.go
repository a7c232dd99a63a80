package deadletter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/time/rate"

	"handoff.dev/handoff/internal/broker"
)

// runner drives one replay run on this replica: it publishes the selected
// dead letters at the run's rate, records each Replay once the publish is
// confirmed, waits for the sample's outcomes, stops at the failure
// threshold, pauses while the app is under pressure, and keeps its claim on
// the run with heartbeats.
type runner struct {
	m    *Manager
	src  *ManagedSource
	id   string
	done chan struct{}
	// pause is why the runner waits now; "" while it publishes.
	pause atomic.Pointer[string]
}

// errNotRunner ends a drive whose run ended or went to another replica.
var errNotRunner = errors.New("no longer this replica's run")

func (r *runner) drive(parent context.Context) {
	defer close(r.done)
	defer func() {
		r.m.mu.Lock()
		delete(r.m.running, r.id)
		r.m.mu.Unlock()
	}()
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.heartbeat(ctx, cancel)
	}()
	state, why, err := r.run(ctx)
	cancel()
	wg.Wait()
	log := r.m.log.With("replay", r.id, "source", r.src.Name)
	switch {
	case errors.Is(err, errNotRunner):
		log.Info("replay no longer driven here", "why", why)
		return
	case err != nil:
		if parent.Err() == nil {
			log.Warn("replay runner failed; it is taken over when its heartbeat is stale", "err", err)
		}
		return
	}
	rec := RunRecord{Version: RecordVersion, Kind: KindRun, Run: r.id, Op: OpEnd, Who: r.m.o.Replica,
		At: r.m.now().UTC(), State: state, Why: why}
	// The end is recorded even while the sidecar stops: a context of its
	// own, bounded.
	endCtx, endCancel := context.WithTimeout(context.WithoutCancel(parent), 10*time.Second)
	defer endCancel()
	if _, err := r.m.appendRun(endCtx, r.src, rec); err != nil {
		log.Warn("recording the replay's end failed; the next runner finds it done", "err", err)
		return
	}
	log.Info("replay ended", "state", state, "why", why)
}

// heartbeat writes a heartbeat every third of the run's TTL, saying whether
// the runner is paused and why, and cancels the drive when the ledger shows
// the run ended or held by another replica.
func (r *runner) heartbeat(ctx context.Context, stop context.CancelFunc) {
	run, err := r.m.o.Index.Run(r.id)
	if err != nil {
		stop()
		return
	}
	every := run.Spec.HeartbeatTTL / 3
	for sleep(ctx, every) {
		rec := RunRecord{Version: RecordVersion, Kind: KindRun, Run: r.id, Op: OpHeartbeat, Who: r.m.o.Replica, At: r.m.now().UTC()}
		if p := r.pause.Load(); p != nil && *p != "" {
			// An operator's reason may fill a record's why by itself.
			rec.Paused, rec.Why = true, truncateWhy(*p)
		}
		run, err := r.m.appendRun(ctx, r.src, rec)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			r.m.log.Warn("replay heartbeat failed", "replay", r.id, "err", err)
			continue
		}
		if run.Ended() || run.Runner != r.m.o.Replica {
			stop()
			return
		}
	}
}

// run publishes the run's selection and says how it ended.
func (r *runner) run(ctx context.Context) (RunState, string, error) {
	run, err := r.current()
	if err != nil {
		return "", "", err
	}
	spec := run.Spec
	// A batch's worth of burst: a publish held up (a busy machine, a slow
	// read) catches up its slots, so that the run keeps its rate on
	// average; the bucket is emptied wherever the run starts, goes on after
	// the sample or pauses — after the entries to publish are read, since it
	// fills while they are (see pipeline.send) — so that it never bursts
	// ahead of the rate.
	lim := rate.NewLimiter(rate.Limit(spec.Rate), spec.BatchSize)
	ids := make([]ID, len(spec.IDs))
	for i, s := range spec.IDs {
		if ids[i], err = ParseID(s); err != nil {
			return "", "", err
		}
	}
	rest := ids
	if spec.Sample > 0 {
		sample := ids[:min(spec.Sample, len(ids))]
		rest = ids[len(sample):]
		p := r.prepare(ctx, sample)
		if p.err != nil {
			return "", "", p.err
		}
		// Waited for and read back: waiting for the sample's outcomes needs
		// to know what was published.
		pl := r.pipeline(ctx, spec, lim)
		if err := pl.wait(ctx, pl.send(p)); err != nil {
			return "", "", err
		}
		known, failed, err := r.awaitOutcomes(ctx, sample, spec.SampleTimeout)
		if err != nil {
			return "", "", err
		}
		if known < countPublished(r, sample) {
			return RunStopped, fmt.Sprintf("the sample's outcomes did not all come within %v: %d of %d known; nothing more was published",
				spec.SampleTimeout, known, len(sample)), nil
		}
		if known > 0 && float64(failed)/float64(known) > spec.StopFailureRatio {
			return RunStopped, fmt.Sprintf("the sample failed: %d of %d replayed copies failed again (%.2f > %.2f); nothing more was published",
				failed, known, float64(failed)/float64(known), spec.StopFailureRatio), nil
		}
	}
	// Each batch's entries are read while the batch before is published,
	// so that the rate does not pause between batches.
	var batches [][]ID
	for len(rest) > 0 {
		n := min(spec.BatchSize, len(rest))
		batches, rest = append(batches, rest[:n]), rest[n:]
	}
	pl := r.pipeline(ctx, spec, lim)
	stopped, why, err := r.publishBatches(ctx, spec, pl, batches)
	if err := pl.wait(ctx, err); err != nil {
		return "", "", err
	}
	if stopped {
		run, err := r.withProgress()
		if err != nil {
			return "", "", err
		}
		return RunStopped, fmt.Sprintf("%s; %d left unpublished", why, run.Progress.Remaining), nil
	}
	run, err = r.withProgress()
	if err != nil {
		return "", "", err
	}
	return RunCompleted, fmt.Sprintf("%d published, %d skipped", run.Progress.Published, run.Progress.Skipped), nil
}

// publishBatches starts the batches' publishes, reading each batch's
// entries while the one before publishes, and looks at the stop threshold
// after each: it reports whether the run stops there, and why.
func (r *runner) publishBatches(ctx context.Context, spec RunSpec, pl *pipeline, batches [][]ID) (bool, string, error) {
	if len(batches) == 0 {
		return false, "", nil
	}
	ahead := r.prepareAsync(ctx, batches, 0)
	for i := range batches {
		p := <-ahead
		if i+1 < len(batches) {
			ahead = r.prepareAsync(ctx, batches, i+1)
		}
		if p.err != nil {
			return false, "", p.err
		}
		if err := pl.send(p); err != nil {
			return false, "", err
		}
		run, err := r.withProgress()
		if err != nil {
			return false, "", err
		}
		pr := run.Progress
		if known := pr.Handled + pr.Failed; known > 0 && float64(pr.Failed)/float64(known) > spec.StopFailureRatio {
			return true, fmt.Sprintf("stop threshold passed: %d of %d replayed copies failed again (%.2f > %.2f)",
				pr.Failed, known, float64(pr.Failed)/float64(known), spec.StopFailureRatio), nil
		}
	}
	return false, "", nil
}

// withProgress is current with the run's progress, which reads every
// selected letter: once a batch, not once a publish.
func (r *runner) withProgress() (Run, error) {
	if _, err := r.current(); err != nil {
		return Run{}, err
	}
	return r.m.o.Index.Run(r.id)
}

// current is the run as the index holds it, without its progress;
// errNotRunner when it ended or another replica holds it.
func (r *runner) current() (Run, error) {
	run, err := r.m.o.Index.runOnly(r.id)
	if err != nil {
		return run, err
	}
	if run.Ended() || run.Runner != r.m.o.Replica {
		return run, fmt.Errorf("%w: %s, runner %q", errNotRunner, run.State, run.Runner)
	}
	return run, nil
}

// prepared is a batch ready to publish: the letters the run may still
// publish, and their DLQ entries.
type prepared struct {
	todo []Letter
	msgs map[ID]*broker.Message
	err  error
}

// prepareAsync prepares batches[i] in the background.
func (r *runner) prepareAsync(ctx context.Context, batches [][]ID, i int) <-chan prepared {
	out := make(chan prepared, 1)
	go func() { out <- r.prepare(ctx, batches[i]) }()
	return out
}

// prepare selects the letters of ids that the run may still publish and
// reads their entries from the DLQ in one read.
func (r *runner) prepare(ctx context.Context, ids []ID) prepared {
	run, err := r.current()
	if err != nil {
		return prepared{err: err}
	}
	var p prepared
	var want []ID
	for _, id := range ids {
		l, err := r.m.o.Index.Get(id)
		if errors.Is(err, ErrNotFound) {
			continue // retention removed it before the index read it: skipped
		}
		if err != nil {
			return prepared{err: err}
		}
		if !runStep(&l, r.id).published && run.replayable(&l) {
			p.todo = append(p.todo, l)
			want = append(want, id)
		}
	}
	if len(p.todo) > 0 {
		p.msgs, p.err = Messages(ctx, r.src.Source, want)
	}
	return p
}

// pipeline publishes across batches: a publish starts on the rate's
// schedule and waits for its broker's confirm while the next ones start,
// up to inflight at once, so that neither the confirms' latency nor a
// batch's end slows the rate. A batch is where the run looks at its stop
// threshold, not a point where publishing stops.
type pipeline struct {
	r     *runner
	lim   *rate.Limiter
	g     *errgroup.Group
	ctx   context.Context
	slots chan struct{}
	mu    sync.Mutex
	last  string // the nonce of the last record appended
	// started: the first batch was sent (send empties the bucket first).
	started bool
}

// maxInflight bounds the publishes waiting for their confirms at once.
const maxInflight = 1000

func (r *runner) pipeline(ctx context.Context, spec RunSpec, lim *rate.Limiter) *pipeline {
	g, gctx := errgroup.WithContext(ctx)
	// Two seconds of the rate, and at least a batch: room for a loaded
	// broker's confirms.
	inflight := min(max(spec.BatchSize, int(math.Ceil(2*spec.Rate))), maxInflight)
	return &pipeline{r: r, lim: lim, g: g, ctx: gctx, slots: make(chan struct{}, inflight)}
}

// send starts the publishes of a prepared batch, one letter at a time at
// the rate, each recorded once its publish is confirmed, and returns once
// the last has started. An error of an earlier publish, a cancel or a
// change of runner stops it.
func (p *pipeline) send(b prepared) error {
	r := p.r
	if !p.started {
		// The pipeline's first publish: the bucket filled while the run
		// waited (the sample's outcomes) and while this batch was read.
		p.started = true
		drainBucket(p.lim)
	}
	for _, l := range b.todo {
		// A slot first, then the app's pressure and the rate: the pressure
		// is read as late as it can be, after the publishes before started.
		select {
		case p.slots <- struct{}{}:
		case <-p.ctx.Done():
			return p.ctx.Err()
		}
		run, err := p.turn()
		if err != nil {
			return err
		}
		// Read again now that its turn came: the batch was read ahead, and
		// an operator may have terminated the letter or approved it with
		// another repair meanwhile (while the run was paused, say).
		l, err := r.m.o.Index.Get(l.ID)
		if errors.Is(err, ErrNotFound) {
			<-p.slots
			continue // retention removed it: skipped
		}
		if err != nil {
			return err
		}
		if runStep(&l, r.id).published || !run.replayable(&l) {
			<-p.slots
			continue // closed, no longer approved, or published: skipped
		}
		msg := b.msgs[l.ID]
		if msg == nil {
			<-p.slots
			r.m.log.Warn("replay: the dead letter's entry is gone from its log; skipped", "replay", r.id, "id", l.ID.String())
			continue
		}
		p.g.Go(func() error {
			defer func() { <-p.slots }()
			nonce, err := r.replayOne(p.ctx, &run, l, msg)
			if err == nil && nonce != "" {
				p.mu.Lock()
				p.last = nonce
				p.mu.Unlock()
			}
			return err
		})
	}
	return nil
}

// turn waits for the next publish's turn: while the run is paused, then for
// the rate's slot. It returns the run as it stands once the slot came,
// read then so that a cancel or a pause that came meanwhile is seen (a
// pause sends it back to waiting).
func (p *pipeline) turn() (Run, error) {
	for {
		paused, err := p.r.wait(p.ctx)
		if err != nil {
			return Run{}, err
		}
		if paused {
			drainBucket(p.lim) // the pause is not caught up
		}
		if err := p.lim.Wait(p.ctx); err != nil {
			return Run{}, err
		}
		run, err := p.r.current()
		if err != nil || !run.Held {
			return run, err
		}
	}
}

// wait waits for every publish started to be confirmed and recorded, and
// reads the ledger into the index up to the last record, for what comes
// next to see them (the sample's outcomes, the run's end).
func (p *pipeline) wait(ctx context.Context, sendErr error) error {
	if err := p.g.Wait(); err != nil {
		return err // a publish's error, which stopped the sending
	}
	if sendErr != nil {
		return sendErr
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if p.last == "" {
		return nil
	}
	return p.r.m.o.Index.catchUpLedger(ctx, p.r.src.Source, p.last)
}

// wait holds the run while an operator has it paused, and while the app is
// under pressure: fresh intake paused, overload answered, the app
// unreachable. A replay shares the app with live traffic, which goes first.
func (r *runner) wait(ctx context.Context) (paused bool, err error) {
	for {
		run, err := r.current()
		if err != nil {
			return paused, err
		}
		why := run.HeldWhy // an operator's pause first
		if !run.Held {
			why = r.m.o.Pressure()
		}
		if why == "" {
			if p := r.pause.Swap(nil); p != nil && *p != "" {
				r.m.log.Info("replay resumed", "replay", r.id)
			}
			return paused, nil
		}
		paused = true
		if p := r.pause.Swap(&why); p == nil || *p != why {
			r.m.log.Info("replay paused", "replay", r.id, "why", why)
		}
		if !sleep(ctx, r.m.o.Poll/4) {
			return paused, ctx.Err()
		}
	}
}

// drainBucket empties the limiter's bucket: the next publish waits its
// slot.
func drainBucket(lim *rate.Limiter) {
	now := time.Now()
	if n := int(lim.TokensAt(now)); n > 0 {
		lim.AllowN(now, n)
	}
}

// replayOne publishes one letter's copy and appends its Replay record,
// whose nonce it returns ("" when none was appended).
func (r *runner) replayOne(ctx context.Context, run *Run, l Letter, msg *broker.Message) (string, error) {
	if l.State == Pending {
		// A forced run approves on the way, in the name of who forced it.
		al, err := r.m.o.Index.Apply(ctx, r.src.Source, Change{ID: l.ID, Transition: Approve, Who: run.CreatedBy,
			Why: "approved by the forced replay " + r.id})
		if err != nil {
			if errors.Is(err, ErrIllegal) || errors.Is(err, ErrLost) {
				return "", nil // closed meanwhile: skipped
			}
			return "", err
		}
		l = al
	}
	copyMsg := *msg
	if a := l.Approval(); a != nil && a.Repair != nil {
		copyMsg.Body = a.Repair.Body
		if a.Repair.ContentType != "" {
			copyMsg.ContentType = a.Repair.ContentType
		}
	}
	trail := broker.Headers{
		broker.HeaderEventID:  l.EventID,
		broker.HeaderReplayID: r.id,
		broker.HeaderReplayOf: l.ID.String(),
	}
	// The record is dated when the publish started: the run's rate is of
	// publishes, and their confirms come back bunched on a busy broker.
	published := r.m.now().UTC()
	if err := r.src.Republisher.Republish(ctx, &copyMsg, trail); err != nil {
		return "", fmt.Errorf("republish %s: %w", l.ID, err)
	}
	// Appended without reading back: the batch reads the ledger once. A
	// record the ledger's order refuses (the copy's outcome came first, or
	// the letter was closed by hand while its copy was on its way) leaves
	// the ledger with the last word, as Apply would.
	rec := Record{Version: RecordVersion, Kind: KindTransition, ID: l.ID.String(), Transition: Replay, State: Replaying,
		Who: r.m.o.Replica, At: published, Why: "published to " + r.src.Name, ReplayID: r.id, Nonce: newNonce()}
	body, err := rec.Encode()
	if err != nil {
		return "", err
	}
	if err := r.src.Ledger.Append(ctx, body); err != nil {
		return "", fmt.Errorf("append to %s: %w", r.src.Ledger.Name(), err)
	}
	return rec.Nonce, nil
}

// awaitOutcomes waits up to d for the outcomes of the published letters of
// ids, and returns how many are known and how many of those failed.
func (r *runner) awaitOutcomes(ctx context.Context, ids []ID, d time.Duration) (known, failed int, err error) {
	deadline := r.m.now().Add(d)
	for {
		if _, err := r.current(); err != nil {
			return 0, 0, err
		}
		known, failed, waiting := 0, 0, 0
		for _, id := range ids {
			l, err := r.m.o.Index.Get(id)
			if err != nil {
				continue
			}
			switch s := runStep(&l, r.id); {
			case s.handled:
				known++
			case s.failed:
				known++
				failed++
			case s.published:
				waiting++
			}
		}
		if waiting == 0 || !r.m.now().Before(deadline) {
			return known, failed, nil
		}
		if !sleep(ctx, r.m.o.Poll/4) {
			return 0, 0, ctx.Err()
		}
	}
}

// countPublished counts the letters of ids the run published.
func countPublished(r *runner, ids []ID) int {
	n := 0
	for _, id := range ids {
		if l, err := r.m.o.Index.Get(id); err == nil && runStep(&l, r.id).published {
			n++
		}
	}
	return n
}
