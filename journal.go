package idempotency

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// A journal is what a run's steps (Step) did, kept with the key's record so
// that a run that takes the key over resumes from it. It lives in the run's
// record, after the record's line (claim.lua's layout), as one entry per
// step in the order they finished:
//
//	s<kind> <name length> <data length>\n<name><data>
//
// kind 'v' for a result (data: the codec's bytes), 'e' for a Permanent
// error (data: its message), 'c' for a Permanent error that the codec
// carries whole (data: ErrorCodec's bytes). Only the run the record names may append to
// it (step.lua); a takeover keeps it and hands it over with the claim; the
// store of the answer replaces the record, journal and all.
type journal struct {
	l         *lease // the run's lease; nil when not resumable
	resumable bool
	limit     int // the journal's bytes, entries whole, at most (WithMaxResponseBytes)

	mu      sync.Mutex
	names   map[string]int32         // the names this run used, each by the attempt that last did
	entries map[string]*journalEntry // journaled by the runs before this one
	done    map[string]stepDone      // what this run's finished steps returned, for its next attempts
	size    int                      // the journal's bytes in the record, for step.lua and limit
	unsaved error                    // a step Redis did not take: the journal is uncertain from here
	// proofUntil is how long the run's ownership of its key is proven
	// (see prove); stopped says a step could not prove it, and did not run.
	proofUntil time.Time
	stopped    bool
	began      bool // a step's function began in this run
	// resumes: the run took over an earlier one, whose step may have begun
	// without being journaled (it stopped first), and taken effect.
	resumes bool
}

// The kinds of a journal entry.
const (
	entryResult     = 'v'
	entryError      = 'e'
	entryCodedError = 'c'
)

// entryKind reports whether b is the kind of a journal entry.
func entryKind(b byte) bool {
	return b == entryResult || b == entryError || b == entryCodedError
}

type journalEntry struct {
	kind byte
	name string
	data string
}

// newJournal is the journal of a resumable run under l, holding what the
// claim handed over when it took earlier runs over (handed, the journal of
// the runs it resumes; nil for a fresh claim).
func newJournal(l *lease, handed *string) (*journal, error) {
	j := &journal{l: l, resumable: true, limit: l.m.cfg.maxResponse, resumes: handed != nil}
	var text string
	if handed != nil {
		text = *handed
	}
	entries, err := parseJournal(text)
	if err != nil {
		return nil, err
	}
	j.entries, j.size = entries, len(text)
	// The claim proved the run its key: its lock was set, for a lease,
	// after the attempt that obtained it began.
	j.proofUntil = l.began.Add(l.m.cfg.lease - l.m.cfg.lease/10)
	return j, nil
}

// A stepDone is what Step returned for a step whose function finished
// (a result, or a Permanent error) in an earlier attempt of the run.
type stepDone struct {
	v   any
	err error
}

// begin starts the step name in attempt (see NextAttempt): it returns the
// step's journaled entry or what an earlier attempt of this run got from
// it (the step does not run), neither (it runs), or ErrStepRepeated for a
// name this attempt used already.
func (j *journal) begin(name string, attempt int32) (*journalEntry, *stepDone, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if used, ok := j.names[name]; ok && used == attempt {
		return nil, nil, fmt.Errorf("%w: %q", ErrStepRepeated, name)
	}
	if j.names == nil {
		j.names = make(map[string]int32)
	}
	j.names[name] = attempt
	if d, ok := j.done[name]; ok {
		return nil, &d, nil
	}
	return j.entries[name], nil, nil
}

// start marks that a step's function begins.
func (j *journal) start() {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.began = true
}

// finish keeps what Step returned for the step name, whose function
// finished, for the run's next attempts.
func (j *journal) finish(name string, v any, err error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.done == nil {
		j.done = make(map[string]stepDone)
	}
	j.done[name] = stepDone{v, err}
}

// write journals the step name's outcome under the run's fence. Writes
// are one at a time, each appended where the last one ended. A record
// that vanished (expired, evicted, flushed) takes no entry, and is no
// failure of the step: its effect happened, the run goes on, and the
// store of its answer writes the record back.
func (j *journal) write(ctx context.Context, name string, kind byte, data []byte) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	entry := appendEntry(make([]byte, 0, len(name)+len(data)+24), kind, name, data)
	if j.unsaved != nil {
		// Whether the last write landed is unknown, so where this one
		// would go is too: the run is kept unless it succeeds anyway.
		return j.unsaved
	}
	if err := j.room(name, len(entry)); err != nil {
		return err
	}
	p, err := j.ask(ctx, entry)
	switch {
	case err != nil:
		j.l.m.cfg.logger.Error("idempotency: a step's result could not be journaled; the run is kept for a retry to "+
			"resume unless it succeeds", "key", j.l.k.record, "step", name, "error", err)
		j.unsaved = fmt.Errorf("step %q was not journaled: %w", name, unavailable(err))
		return j.unsaved
	case p.owned == 0:
		return fmt.Errorf("%w: step %q was not journaled: the key is another execution's now", ErrLockLost, name)
	case p.owned < 0:
		j.l.m.cfg.logger.Warn("idempotency: the key's record vanished while its run took steps (record TTL, "+
			"eviction or a flush); the step is not journaled, and the run's answer will write the record back",
			"key", j.l.k.record, "step", name)
		return nil
	}
	j.size += len(entry)
	return nil
}

// fits reports whether the entry of the step name with data would fit the
// journal now: ErrStepTooLarge when it would not.
func (j *journal) fits(name string, data []byte) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.room(name, entrySize(name, len(data)))
}

// room reports whether an entry of size bytes fits what the journal has
// left; j.mu is held. The whole entry counts, its name and framing too:
// steps with tiny or empty results must not grow the record without bound.
func (j *journal) room(name string, size int) error {
	if j.size+size > j.limit {
		return fmt.Errorf("%w: step %q: %d bytes, with %d journaled before it, past the limit of %d (WithMaxResponseBytes)",
			ErrStepTooLarge, name, size, j.size, j.limit)
	}
	return nil
}

// prove makes sure, before the step name runs, that the run still owns
// its key: that nobody can have taken it over and done the step already.
// The last answer from Redis (the claim, or the last step's journal write)
// proves it for as long as the run's lock had left then; past that (a
// pause, a slow stretch between two steps) Redis is asked again. A step
// that may not start marks the run, which is then kept unless it succeeds.
func (j *journal) prove(ctx context.Context, name string) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if time.Now().Before(j.proofUntil) {
		return nil
	}
	_, err := j.ask(ctx, nil)
	switch {
	case err != nil:
		j.stopped = true
		return fmt.Errorf("idempotency: step %q not started: whether the run still owns its key is unknown: %w",
			name, unavailable(err))
	case !time.Now().Before(j.proofUntil):
		j.stopped = true
		return fmt.Errorf("idempotency: step %q not started: the run no longer holds its key, which another "+
			"execution may have taken over: %w", name, ErrLockLost)
	}
	return nil
}

// ask runs step.lua for entry (nil: a proof only), tried again briefly,
// and keeps what its answer proves. Called under j.mu.
func (j *journal) ask(ctx context.Context, entry []byte) (runProof, error) {
	l := j.l
	var (
		p   runProof
		err error
	)
	for attempt, pause := 0, 10*time.Millisecond; attempt < 3; attempt, pause = attempt+1, pause*2 {
		if attempt > 0 {
			time.Sleep(pause)
		}
		sent := time.Now() // Redis read the lock's time left after this
		step, cancel := l.m.stepContext(ctx)
		p, err = l.m.keyStore.journal(step, l.k, l.lockValue, entry, j.size)
		cancel()
		if err == nil {
			j.proven(sent, p)
			return p, nil
		}
	}
	j.proofUntil = time.Time{}
	return p, err
}

// proven keeps how long an answer of Redis, asked at sent, proves the run
// owns its key: while the run's lock holds, a tenth of a lease less for
// the two clocks. Where the record vanished, the lock alone proves it.
func (j *journal) proven(sent time.Time, p runProof) {
	j.proofUntil = time.Time{}
	if margin := j.l.m.cfg.lease / 10; p.owned != 0 && p.left > margin {
		j.proofUntil = sent.Add(p.left - margin)
	}
}

// tookEffect reports whether a step of the run may have taken effect: one
// began its function, or the run resumes others, which may have begun one
// (journaled or not: a run that stopped mid-step journaled nothing of it).
func (j *journal) tookEffect() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.began || j.size > 0 || j.resumes
}

// lostStep reports whether a step's result may be missing from the
// journal because Redis did not take it, or a step did not start because
// the run could not prove it still owns its key.
func (j *journal) lostStep() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.unsaved != nil || j.stopped
}

// entrySize is the length of appendEntry's entry for a name and data of
// dataLen bytes.
func entrySize(name string, dataLen int) int {
	return len("sK ") + len(strconv.Itoa(len(name))) + len(" ") + len(strconv.Itoa(dataLen)) + len("\n") + len(name) + dataLen
}

// appendEntry appends a journal entry to b.
func appendEntry(b []byte, kind byte, name string, data []byte) []byte {
	b = append(b, 's', kind, ' ')
	b = strconv.AppendInt(b, int64(len(name)), 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(len(data)), 10)
	b = append(b, '\n')
	return append(append(b, name...), data...)
}

var errCorruptJournal = errors.New("idempotency: corrupt step journal")

// parseJournal reads a journal's entries.
func parseJournal(text string) (map[string]*journalEntry, error) {
	var entries map[string]*journalEntry
	for text != "" {
		head, rest, ok := strings.Cut(text, "\n")
		if !ok || len(head) < 3 || head[0] != 's' || !entryKind(head[1]) || head[2] != ' ' {
			return nil, errCorruptJournal
		}
		nl, dl, ok := strings.Cut(head[3:], " ")
		n, err1 := strconv.Atoi(nl)
		d, err2 := strconv.Atoi(dl)
		if !ok || err1 != nil || err2 != nil || n < 0 || d < 0 || n+d > len(rest) {
			return nil, errCorruptJournal
		}
		e := &journalEntry{kind: head[1], name: rest[:n], data: rest[n : n+d]}
		if entries == nil {
			entries = make(map[string]*journalEntry)
		}
		if entries[e.name] == nil { // a step journals once; the first entry stands
			entries[e.name] = e
		}
		text = rest[n+d:]
	}
	return entries, nil
}

// journal returns the execution's journal: the resumable run's, or one made
// on the first Step of a run that is not, which only keeps its names.
func (x *execution) journal() *journal {
	if j := x.steps.Load(); j != nil {
		return j
	}
	x.steps.CompareAndSwap(nil, &journal{})
	return x.steps.Load()
}

// tookEffect reports whether a step of the execution may have taken
// effect (see journal.tookEffect).
func (x *execution) tookEffect() bool {
	j := x.steps.Load()
	return j != nil && j.tookEffect()
}

// resultCodec encodes step results: Do's codec, or JSON for a handler.
func (x *execution) resultCodec() Codec {
	if x.codec != nil {
		return x.codec
	}
	return JSON
}
