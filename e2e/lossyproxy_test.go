package e2e

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"

	"github.com/onceonly/idempotency"
	"github.com/stretchr/testify/require"
)

// A lossyProxy is a TCP proxy in front of an HTTP server that loses the
// first answers: it forwards each request, reads the server's whole answer,
// and closes the client's connection instead of passing the answer on. The
// server got the request and ran it; the client only sees its connection
// close, as when a network fails on the way back.
type lossyProxy struct {
	ln       net.Listener
	upstream string // host:port
	wg       sync.WaitGroup

	mu        sync.Mutex
	lose      int // answers still to lose
	exchanges []exchange
	conns     map[net.Conn]bool
}

// An exchange is one request that passed through the proxy.
type exchange struct {
	key      string // its Idempotency-Key
	status   int    // the server's answer
	replayed bool   // the answer carried Idempotent-Replayed: true
	lost     bool   // the client never got it
}

func startLossyProxy(t *testing.T, upstream string) *lossyProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &lossyProxy{ln: ln, upstream: upstream, conns: map[net.Conn]bool{}}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *lossyProxy) URL() string { return "http://" + p.ln.Addr().String() }

// loseNext makes the proxy lose the next n answers.
func (p *lossyProxy) loseNext(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lose = n
}

// seen returns the exchanges so far and forgets them.
func (p *lossyProxy) seen() []exchange {
	p.mu.Lock()
	defer p.mu.Unlock()
	seen := p.exchanges
	p.exchanges = nil
	return seen
}

func (p *lossyProxy) accept() {
	for {
		conn, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.conns[conn] = true
		p.mu.Unlock()
		p.wg.Go(func() {
			defer func() {
				conn.Close()
				p.mu.Lock()
				delete(p.conns, conn)
				p.mu.Unlock()
			}()
			p.serve(conn)
		})
	}
}

// serve passes the requests of one client connection on, one at a time,
// until the client leaves or an answer is lost.
func (p *lossyProxy) serve(conn net.Conn) {
	br := bufio.NewReader(conn)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		resp, body, err := p.forward(req)
		if err != nil {
			return
		}
		p.mu.Lock()
		lost := p.lose > 0
		if lost {
			p.lose--
		}
		p.exchanges = append(p.exchanges, exchange{key: req.Header.Get(idempotency.KeyHeader), status: resp.StatusCode,
			replayed: resp.Header.Get(idempotency.ReplayedHeader) == "true", lost: lost})
		p.mu.Unlock()
		if lost {
			return
		}
		resp.Body = io.NopCloser(bytes.NewReader(body))
		resp.ContentLength, resp.TransferEncoding = int64(len(body)), nil
		if resp.Write(conn) != nil {
			return
		}
	}
}

// forward sends req to the server on a connection of its own and reads the
// whole answer.
func (p *lossyProxy) forward(req *http.Request) (*http.Response, []byte, error) {
	up, err := net.Dial("tcp", p.upstream)
	if err != nil {
		return nil, nil, err
	}
	defer up.Close()
	if err := req.Write(up); err != nil {
		return nil, nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(up), req)
	if err != nil {
		return nil, nil, err
	}
	body, err := io.ReadAll(resp.Body)
	return resp, body, err
}
