//go:build linux

package main

import (
	"io"
	"net"
	"sync"
	"testing"
)

// A redisLink stands between the servers and Redis on loopback, and can
// make Redis unreachable for them: cut closes every connection it carries
// and, until mend, every new one as soon as it is accepted, as a network
// partition or a Redis restart does (the servers' dials succeed, and the
// first read fails).
type redisLink struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	down  bool
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

func newRedisLink(t *testing.T, target string) *redisLink {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &redisLink{ln: ln, target: target, conns: map[net.Conn]bool{}}
	l.wg.Go(l.accept)
	t.Cleanup(func() {
		ln.Close()
		l.cut()
		l.wg.Wait()
	})
	return l
}

func (l *redisLink) addr() string { return l.ln.Addr().String() }

func (l *redisLink) accept() {
	for {
		client, err := l.ln.Accept()
		if err != nil {
			return
		}
		l.mu.Lock()
		down := l.down
		l.mu.Unlock()
		if down {
			client.Close()
			continue
		}
		server, err := net.Dial("tcp", l.target)
		if err != nil {
			client.Close()
			continue
		}
		l.mu.Lock()
		if l.down {
			l.mu.Unlock()
			client.Close()
			server.Close()
			continue
		}
		l.conns[client], l.conns[server] = true, true
		l.mu.Unlock()
		l.wg.Go(func() { l.pipe(client, server) })
		l.wg.Go(func() { l.pipe(server, client) })
	}
}

// pipe copies from src to dst until either end closes, then closes both.
func (l *redisLink) pipe(dst, src net.Conn) {
	io.Copy(dst, src)
	dst.Close()
	src.Close()
	l.mu.Lock()
	delete(l.conns, dst)
	delete(l.conns, src)
	l.mu.Unlock()
}

// cut makes Redis unreachable until mend.
func (l *redisLink) cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.down = true
	for c := range l.conns {
		c.Close()
	}
}

func (l *redisLink) mend() {
	l.mu.Lock()
	l.down = false
	l.mu.Unlock()
}
