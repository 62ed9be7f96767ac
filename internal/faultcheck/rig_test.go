package faultcheck_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/internal/sqltest"
	"github.com/onceonly/idempotency/internal/syncbuf"
	"github.com/redis/go-redis/v9"
)

// rig is what the fault check runs against: the middleware's store (a
// Redis, or an SQL database), the application's database, and two server
// instances, each talking to the store through a fault proxy of its own
// (SQLite, a file, has no connection to fault).
//
// The effects go to a second redis-server, the application's database,
// never faulted and reached directly: the faults under test are those
// between the middleware and its store, and an effect whose own write
// could be lost or stalled would leave the count of effects, the ground
// truth of the check, uncertain.
type rig struct {
	t         *testing.T
	keys      keyStore          // the middleware's store
	store     *redistest.Server // the middleware's Redis; nil on SQL
	effects   *redistest.Server // the application's database
	storeDB   *redis.Client     // not through a proxy: for inspecting keys; nil on SQL
	effectsDB *redis.Client
	instances []*instanceProc
	timeline  timeline
	http      *http.Client

	// Redis itself is faulted by one history at a time: a SIGCONT ends
	// every SIGSTOP, and a restart or a CONFIG SET must not meet a stopped
	// server.
	redisFaults sync.Mutex
	// restarts holds a Redis restart off while a late phase reads what
	// the token-mode keys' records hold and sends them again
	// (late_test.go): a restart then would lose what it is to
	// judge.
	restarts sync.RWMutex
	// lanes is held shared by every history while it runs, and alone by
	// a history that must run without any other beside it (plan.alone).
	lanes sync.RWMutex
	// starved counts the windows watchStarvation marked.
	starved atomic.Int64
	// broken is set when the rig itself failed (an instance that does not
	// start, a database that does not answer): the run stops.
	broken atomic.Bool
}

// fail reports a failure of the rig, from any goroutine, and stops the run.
func (r *rig) fail(format string, args ...any) {
	r.t.Errorf(format, args...)
	r.broken.Store(true)
}

// newRig starts the rig on a private Redis.
func newRig(t *testing.T) *rig {
	r := &rig{t: t, store: redistest.Private(t)}
	r.storeDB, r.keys = r.store.Client(t), redisKeys{r}
	return r.start()
}

// newSQLRig starts the rig on an SQL database, its keys in a table of
// their own.
func newSQLRig(t *testing.T, d *sqltest.DB) *rig {
	keys := sqlKeys{db: d, table: d.Table(t, "faultcheck"), probe: d.Table(t, "faultcheck_probe")}
	if err := keys.newProbe(); err != nil {
		t.Fatal(err)
	}
	// The keys table exists before the first history: a db-stall drawn
	// before any instance reached the database would find none to lock.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := keys.operatorMiddleware("").Ready(ctx); err != nil {
		t.Fatalf("creating the keys table: %v", err)
	}
	r := &rig{t: t, keys: keys}
	stop := make(chan struct{})
	go r.watchDatabase(stop)
	t.Cleanup(func() { close(stop) })
	return r.start()
}

// start starts the application's database and the instances.
func (r *rig) start() *rig {
	t := r.t
	r.effects = redistest.Private(t)
	r.effectsDB = r.effects.Client(t)
	// Few idle connections: net/http resends a request that carries an
	// Idempotency-Key on every reused connection that closes without an
	// answer, as a handler's panic closes it; with a crowd's connections
	// idle, one request panicking before any effect ran its handler 60
	// times over 15 s, each run released and resent.
	transport := &http.Transport{MaxIdleConnsPerHost: 8, DisableCompression: true}
	r.http = &http.Client{Transport: transport}
	t.Cleanup(transport.CloseIdleConnections)
	for i, name := range []string{"a", "b"} {
		p := &instanceProc{name: name, proxy: r.newProxy(), effects: r.effects.Addr(), drain: drainDeadline,
			starved:  func(from, to time.Time) { r.markStarved(i, from, to) },
			slowDial: func(from, to time.Time) { r.markSlowDial(i, from, to) }}
		p.spec = instanceSpec{Name: name, Effects: p.effects, Drain: p.drain}
		addr := ""
		if p.proxy != nil {
			addr = p.proxy.Addr()
		}
		r.keys.connect(&p.spec, addr)
		if err := p.start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.stop)
		r.instances = append(r.instances, p)
	}
	stop := make(chan struct{})
	go watchScheduling(stop, func(from, to time.Time) { r.markStarved(-1, from, to) })
	t.Cleanup(func() {
		close(stop)
		t.Logf("a process of the check went %v or more unscheduled, the database as long to commit, or an instance as long to open a connection, %d times", starvedAfter, r.starved.Load())
	})
	return r
}

// instanceProc is one server instance's process, started again after each
// kill.
type instanceProc struct {
	name    string
	proxy   *redistest.Proxy // nil when the store has no connection to fault
	spec    instanceSpec     // what each of its processes is started with
	effects string
	drain   time.Duration // the deadline of its drain after SIGTERM
	// starved is told each window its process reports it was not
	// scheduled in (starved_test.go), slowDial each of its database
	// connections that took as long to open (dial_test.go).
	starved, slowDial func(from, to time.Time)

	// lifecycle serializes kills and restarts; proxyFaults the delays
	// and blackholes of its proxy.
	lifecycle, proxyFaults sync.Mutex

	mu     sync.Mutex // guards what follows
	cmd    *exec.Cmd
	out    *syncbuf.Buffer // the process's output
	url    string
	exited chan struct{}
	killed bool // or terminated, by the check, on purpose
	// outputs of every process so far: a data race or a crash in any of
	// them fails the check.
	outputs []*syncbuf.Buffer
	// unexpected exits, with their output
	crashes []string
}

const instanceStartLimit = 60 * time.Second

// start runs a new process of the instance and waits until it listens.
func (p *instanceProc) start() error {
	spec := p.spec
	spec.Drain = p.drain
	specJSON, _ := json.Marshal(spec)
	cmd := exec.Command(os.Args[0], "-test.run=^TestFaultCheckInstance$")
	cmd.Env = append(os.Environ(), instanceEnv+"="+string(specJSON))
	cmd.SysProcAttr = instanceProcAttr()
	out := &syncbuf.Buffer{}
	listening := &listenWatch{out: out, addr: make(chan string, 1), starved: p.starved, slowDial: p.slowDial}
	cmd.Stdout, cmd.Stderr = listening, out
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.cmd == cmd && !p.killed {
			p.crashes = append(p.crashes, fmt.Sprintf("instance %s (pid %d) exited on its own: %v\n%s",
				p.name, cmd.Process.Pid, cmd.ProcessState, out))
		}
	}()
	select {
	case a := <-listening.addr:
		p.mu.Lock()
		p.cmd, p.out, p.url, p.exited, p.killed = cmd, out, "http://"+a, exited, false
		p.outputs = append(p.outputs, out)
		p.mu.Unlock()
		return nil
	case <-exited:
		return fmt.Errorf("instance %s exited at start-up:\n%s", p.name, out)
	case <-time.After(instanceStartLimit):
		cmd.Process.Kill()
		return fmt.Errorf("instance %s did not listen within %v:\n%s", p.name, instanceStartLimit, out)
	}
}

// listenWatch keeps an instance's standard output, passes on the address
// in its listening line, the windows in which it was not scheduled, and
// its slow dials.
type listenWatch struct {
	out               *syncbuf.Buffer
	addr              chan string
	starved, slowDial func(from, to time.Time)
	pending           []byte // the line being written
	told              bool
}

func (w *listenWatch) Write(b []byte) (int, error) {
	w.out.Write(b)
	w.pending = append(w.pending, b...)
	for {
		line, rest, ok := bytes.Cut(w.pending, []byte("\n"))
		if !ok {
			return len(b), nil
		}
		w.pending = rest
		if a, ok := strings.CutPrefix(string(line), listeningLine); ok && !w.told {
			w.addr <- a
			w.told = true
		} else if from, to, ok := readWindow(string(line), starvedLine); ok && w.starved != nil {
			w.starved(from, to)
		} else if from, to, ok := readWindow(string(line), slowDialLine); ok && w.slowDial != nil {
			w.slowDial(from, to)
		}
	}
}

// baseURL is where the instance listens now; a killed instance's old
// address refuses connections until it is back.
func (p *instanceProc) baseURL() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.url
}

// kill ends the process with SIGKILL, as a crash or the OOM killer would:
// no deferred function runs, nothing shuts down, no answer is stored. Call
// with p.lifecycle held. It returns the process's id.
func (p *instanceProc) kill() int {
	cmd, exited, _ := p.signal(syscall.SIGKILL)
	<-exited
	return cmd.Process.Pid
}

// signal sends sig to the process, which the check means to end.
func (p *instanceProc) signal(sig syscall.Signal) (*exec.Cmd, <-chan struct{}, *syncbuf.Buffer) {
	p.mu.Lock()
	p.killed = true
	cmd, exited, out := p.cmd, p.exited, p.out
	p.mu.Unlock()
	cmd.Process.Signal(sig)
	return cmd, exited, out
}

func (p *instanceProc) stop() {
	p.lifecycle.Lock()
	defer p.lifecycle.Unlock()
	p.kill()
}

// problems returns what went wrong inside the instance's processes: exits
// nobody asked for, and data races.
func (p *instanceProc) problems() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	found := append([]string(nil), p.crashes...)
	for _, out := range p.outputs {
		if s := out.String(); strings.Contains(s, "WARNING: DATA RACE") || strings.Contains(s, "panic: ") {
			found = append(found, fmt.Sprintf("instance %s reported:\n%s", p.name, s))
		}
	}
	return found
}

// inflight asks the instance how many requests of the history are still
// inside the middleware; ok is false when it cannot tell (it is down).
func (r *rig) inflight(p *instanceProc, prefix string) (n int, ok bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.baseURL()+"/inflight?prefix="+prefix, nil)
	resp, err := r.http.Do(req)
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	n, err = strconv.Atoi(string(b))
	return n, err == nil
}

// timeline is every fault injected so far, whichever history injected it:
// they all share the instances and Redis, so a fault hits every history
// that runs while it lasts.
type timeline struct {
	mu     sync.Mutex
	events map[int]faultEvent // by id
	last   int
}

// faultEvent is a fault as injected: a window (from, to), or a moment
// (to equal to from).
type faultEvent struct {
	kind     string
	instance int // -1: every instance (Redis itself)
	from, to time.Time
	ongoing  bool // to is only the moment the timeline was read
	what     string
	history  int          // the index of the history that injected it
	pid      int          // kill, drain: the process ended
	drain    *drainReport // drain: how it went
}

// timelineMemory is how long the timeline keeps a fault: far longer than
// any history.
const timelineMemory = 5 * time.Minute

// begin adds a fault as it begins, and returns its id for end.
func (tl *timeline) begin(e faultEvent) int {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if tl.events == nil {
		tl.events = map[int]faultEvent{}
	}
	for id, old := range tl.events {
		if !old.to.IsZero() && time.Since(old.to) > timelineMemory {
			delete(tl.events, id)
		}
	}
	tl.last++
	tl.events[tl.last] = e
	return tl.last
}

// end records the fault of id as it ended.
func (tl *timeline) end(id int, e faultEvent) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.events[id] = e
}

// between returns the faults that overlap [from, to], those still going on
// included.
func (tl *timeline) between(from, to time.Time) []faultEvent {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	var found []faultEvent
	for _, e := range tl.events {
		if e.to.IsZero() {
			e.to, e.ongoing = time.Now(), true
		}
		if !e.to.Before(from) && !e.from.After(to) {
			found = append(found, e)
		}
	}
	slices.SortFunc(found, func(a, b faultEvent) int { return a.from.Compare(b.from) })
	return found
}
