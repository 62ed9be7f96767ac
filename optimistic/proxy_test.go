package optimistic

import (
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// proxy forwards loopback TCP connections to a target and can stall every
// one of them at once, as a process pause or a network partition does to
// the process on its far side: bytes sent meanwhile wait in the proxy and
// go on, late, when it resumes.
type proxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu     sync.Mutex
	gate   *sync.Cond // signalled on resume and close
	paused bool
	closed bool
	conns  []net.Conn
}

// startProxy listens on a free loopback port until t ends.
func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &proxy{ln: ln, target: target}
	p.gate = sync.NewCond(&p.mu)
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		if !p.track(client, server) {
			return
		}
		p.wg.Go(func() { p.pipe(server, client) })
		p.wg.Go(func() { p.pipe(client, server) })
	}
}

func (p *proxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, c := range conns {
			c.Close()
		}
		return false
	}
	p.conns = append(p.conns, conns...)
	return true
}

// pipe copies src to dst, holding every chunk while the proxy is paused.
func (p *proxy) pipe(dst, src net.Conn) {
	defer dst.Close() // and so the other direction ends too
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.wait()
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *proxy) wait() {
	p.mu.Lock()
	for p.paused && !p.closed {
		p.gate.Wait()
	}
	p.mu.Unlock()
}

// pause stalls every connection, open or opened later, until resume.
func (p *proxy) pause() {
	p.mu.Lock()
	p.paused = true
	p.mu.Unlock()
}

func (p *proxy) resume() {
	p.mu.Lock()
	p.paused = false
	p.mu.Unlock()
	p.gate.Broadcast()
}

func (p *proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.gate.Broadcast()
	p.wg.Wait()
}
