package redistest

import (
	"bytes"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy is a loopback TCP proxy in front of a Redis (or between a replica
// and its primary). It passes bytes through, and on demand:
//
//   - delays every reply by a fixed time (a slow network or a busy Redis);
//   - loses the reply to the next command containing a needle: it forwards
//     the command, Redis runs it, and the instance's connection is closed
//     instead of the reply passed on, so go-redis resends the command on a
//     new connection, which is exactly the case the scripts must survive;
//   - blackholes: keeps every connection open and discards every byte in
//     both directions (a partition). When it lifts, the connections that
//     lost bytes are closed, as a healed network resets the connections it
//     broke: a stream with a hole in it is not a Redis conversation any
//     more. A blackhole can begin at a chosen command, which then never
//     runs, or at a chosen reply, which is lost with everything after it
//     (a resend's too): the command ran, and the instance cannot tell;
//   - refuses: closes every connection and stops listening, so that a
//     connection attempt is refused at once (a Redis that is down), and
//     listens again on the same address when it ends.
type Proxy struct {
	addr   string
	target string

	delay     atomic.Int64                // nanoseconds added before each reply
	blackhole atomic.Bool                 // discard everything while set
	holeAt    atomic.Pointer[[]byte]      // start the blackhole at the next command containing this
	holeAfter atomic.Pointer[replyHole]   // start it at a chosen reply
	drop      atomic.Pointer[[]byte]      // lose the reply to the next command containing this
	hold      atomic.Pointer[heldCommand] // forward the next command containing this late
	dropped   atomic.Int64                // replies lost so far
	unheard   atomic.Int64                // reads of commands a blackhole discarded so far

	mu     sync.Mutex
	ln     net.Listener // nil while refusing
	closed bool
	pairs  map[*proxyPair]bool
	wg     sync.WaitGroup
}

// proxyPair is one client connection and the Redis connection it was
// given.
type proxyPair struct {
	client, server net.Conn
	doomed         atomic.Bool               // its next reply is lost
	watched        atomic.Pointer[replyHole] // its next reply may begin that blackhole
	torn           atomic.Bool               // it lost bytes to a blackhole
}

func (p *proxyPair) close() {
	p.client.Close()
	p.server.Close()
}

// NewProxy starts a proxy to target, closed when the test ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{addr: ln.Addr().String(), ln: ln, target: target, pairs: map[*proxyPair]bool{}}
	p.wg.Go(func() { p.accept(ln) })
	t.Cleanup(p.Close)
	return p
}

// Addr is the address to connect to instead of target.
func (p *Proxy) Addr() string { return p.addr }

// Dropped is how many replies the proxy has lost so far.
func (p *Proxy) Dropped() int64 { return p.dropped.Load() }

// Unheard is how many reads of the instance's commands blackholes have
// discarded so far: about one for each command sent into one, as a client
// sends a command in one write.
func (p *Proxy) Unheard() int64 { return p.unheard.Load() }

// Close stops accepting, closes every connection and waits for the
// forwarding goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.stopListening()
	p.mu.Unlock()
	p.wg.Wait()
}

// Refuse closes every connection and stops listening until EndRefuse: a
// connection attempt is refused at once, as by a Redis that is down.
func (p *Proxy) Refuse() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopListening()
}

// EndRefuse listens again on the same address.
func (p *Proxy) EndRefuse() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.ln != nil {
		return nil
	}
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		return err
	}
	p.ln = ln
	p.wg.Go(func() { p.accept(ln) })
	return nil
}

// stopListening closes the listener and every connection; p.mu is held.
func (p *Proxy) stopListening() {
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for pair := range p.pairs {
		pair.close()
	}
}

// SetDelay delays every reply by d from now on (0: none).
func (p *Proxy) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

// DropNextReply arms the proxy: the reply to the next command whose bytes,
// in lower case, contain needle (any command, when needle is empty) is
// lost. A needle is a lower-case command name or a script's SHA1.
func (p *Proxy) DropNextReply(needle string) {
	b := []byte(needle)
	p.drop.Store(&b)
}

// StartBlackhole discards every byte from now on, until EndBlackhole.
func (p *Proxy) StartBlackhole() { p.blackhole.Store(true) }

// BlackholeAt arms the proxy: the next command whose bytes, in lower case,
// contain needle (a command name or a script's SHA1) is discarded, and so
// is every byte after it, until EndBlackhole. A partition that begins at a
// chosen step.
func (p *Proxy) BlackholeAt(needle string) {
	b := []byte(needle)
	p.holeAt.Store(&b)
}

// A replyHole is where BlackholeAtReply begins a blackhole.
type replyHole struct {
	command, reply []byte
	holed          chan struct{}
}

// BlackholeAtReply arms the proxy: the next reply whose bytes, in lower
// case, contain reply (a word of a script's answer), to a command whose
// bytes contain command (a key's name), is discarded, and so is every byte
// after it, until EndBlackhole. Redis ran the command; the instance hears
// neither its reply nor that of a resend. The channel is closed when the
// blackhole begins.
func (p *Proxy) BlackholeAtReply(command, reply string) <-chan struct{} {
	h := &replyHole{command: []byte(strings.ToLower(command)), reply: []byte(strings.ToLower(reply)),
		holed: make(chan struct{})}
	p.holeAfter.Store(h)
	return h.holed
}

// A heldCommand is what HoldCommand holds back, and for how long.
type heldCommand struct {
	needle []byte
	d      time.Duration
}

// HoldCommand arms the proxy: the next command whose bytes, in lower case,
// contain needle reaches Redis d late, and so does what its connection
// sends after it (a slow link, on which a command sent in time lands after
// another instance's sent later).
func (p *Proxy) HoldCommand(needle string, d time.Duration) {
	p.hold.Store(&heldCommand{needle: []byte(strings.ToLower(needle)), d: d})
}

// Disarm forgets the commands and replies the proxy was armed to act on
// (DropNextReply, HoldCommand, BlackholeAt, BlackholeAtReply) that have
// not come yet.
func (p *Proxy) Disarm() {
	p.drop.Store(nil)
	p.hold.Store(nil)
	p.holeAt.Store(nil)
	p.holeAfter.Store(nil)
}

// EndBlackhole passes bytes again, and closes the connections that lost
// some.
func (p *Proxy) EndBlackhole() {
	p.blackhole.Store(false)
	p.mu.Lock()
	defer p.mu.Unlock()
	for pair := range p.pairs {
		if pair.torn.Load() {
			pair.close()
		}
	}
}

func (p *Proxy) accept(ln net.Listener) {
	for {
		client, err := ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		pair := &proxyPair{client: client, server: server}
		p.mu.Lock()
		if p.ln != ln { // refusing, or closed, since the accept
			p.mu.Unlock()
			pair.close()
			continue
		}
		p.pairs[pair] = true
		p.mu.Unlock()
		p.wg.Go(func() { p.commands(pair) })
		p.wg.Go(func() {
			p.replies(pair)
			p.mu.Lock()
			delete(p.pairs, pair)
			p.mu.Unlock()
		})
	}
}

// commands forwards what the instance sends, watching for the command
// whose reply is to be lost.
func (p *Proxy) commands(pair *proxyPair) {
	defer pair.close()
	buf := make([]byte, 64<<10)
	for {
		n, err := pair.client.Read(buf)
		if n > 0 {
			if needle := p.holeAt.Load(); needle != nil &&
				bytes.Contains(bytes.ToLower(buf[:n]), *needle) && p.holeAt.CompareAndSwap(needle, nil) {
				p.blackhole.Store(true)
			}
			if p.blackhole.Load() {
				pair.torn.Store(true)
				p.unheard.Add(1)
				continue
			}
			if pair.torn.Load() {
				return
			}
			if needle := p.drop.Load(); needle != nil &&
				bytes.Contains(bytes.ToLower(buf[:n]), *needle) && p.drop.CompareAndSwap(needle, nil) {
				pair.doomed.Store(true)
			}
			if h := p.holeAfter.Load(); h != nil && bytes.Contains(bytes.ToLower(buf[:n]), h.command) {
				pair.watched.Store(h)
			}
			if h := p.hold.Load(); h != nil && bytes.Contains(bytes.ToLower(buf[:n]), h.needle) && p.hold.CompareAndSwap(h, nil) {
				time.Sleep(h.d)
			}
			if _, err := pair.server.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// replies forwards what Redis answers, late when delayed, and not at all
// for a doomed reply: the connection closes instead.
func (p *Proxy) replies(pair *proxyPair) {
	defer pair.close()
	buf := make([]byte, 64<<10)
	for {
		n, err := pair.server.Read(buf)
		if n > 0 {
			if pair.doomed.Load() {
				p.dropped.Add(1)
				return
			}
			if d := time.Duration(p.delay.Load()); d > 0 {
				time.Sleep(d)
			}
			if h := pair.watched.Swap(nil); h != nil &&
				bytes.Contains(bytes.ToLower(buf[:n]), h.reply) && p.holeAfter.CompareAndSwap(h, nil) {
				p.blackhole.Store(true)
				close(h.holed)
			}
			if p.blackhole.Load() {
				pair.torn.Store(true)
				continue
			}
			if pair.torn.Load() {
				return
			}
			if _, err := pair.client.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
