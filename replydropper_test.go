package idempotency

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// replyDropper is a loopback TCP proxy in front of Redis that loses the
// reply to a chosen command: it forwards the command, lets Redis run it,
// then closes the client's connection instead of passing the answer on.
// go-redis sees the connection fail after sending and resends the command
// on a new connection, which is exactly the case the scripts must survive.
type replyDropper struct {
	ln      net.Listener
	target  string
	match   atomic.Pointer[[]byte] // drop the reply to the next command containing this
	dropped atomic.Int64
	// blackhole, while set, discards every byte in both directions: a
	// network partition that keeps the connections open.
	blackhole atomic.Bool
	wg        sync.WaitGroup
}

func newReplyDropper(t *testing.T, target string) *replyDropper {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &replyDropper{ln: ln, target: target}
	p.wg.Go(p.accept)
	t.Cleanup(func() { ln.Close(); p.wg.Wait() })
	return p
}

func (p *replyDropper) addr() string { return p.ln.Addr().String() }

// dropNext arms the proxy: the reply to the next command that contains
// needle is lost.
func (p *replyDropper) dropNext(needle []byte) { p.match.Store(&needle) }

func (p *replyDropper) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		var doomed atomic.Bool
		p.wg.Go(func() { // client to server, watching for the armed command
			buf := make([]byte, 64<<10)
			for {
				n, err := client.Read(buf)
				if n > 0 {
					if m := p.match.Load(); m != nil && len(*m) > 0 && bytes.Contains(buf[:n], *m) &&
						p.match.CompareAndSwap(m, nil) {
						doomed.Store(true)
					}
					if p.blackhole.Load() {
						continue
					}
					if _, werr := server.Write(buf[:n]); werr != nil {
						break
					}
				}
				if err != nil {
					break
				}
			}
			server.Close()
		})
		p.wg.Go(func() { // server to client, losing the doomed reply
			buf := make([]byte, 64<<10)
			for {
				n, err := server.Read(buf)
				if n > 0 && doomed.Load() {
					p.dropped.Add(1)
					break
				}
				if n > 0 && !p.blackhole.Load() {
					if _, werr := client.Write(buf[:n]); werr != nil {
						break
					}
				}
				if err != nil {
					break
				}
			}
			client.Close()
			server.Close()
		})
	}
}
