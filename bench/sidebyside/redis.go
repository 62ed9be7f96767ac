package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// commandCalls reads INFO commandstats: calls per command, those a script
// runs inside Redis included (they appear under their own names).
func commandCalls(ctx context.Context, rdb *redis.Client) (map[string]int64, error) {
	stats, err := commandStats(ctx, rdb)
	calls := map[string]int64{}
	for name, st := range stats {
		calls[name] = st.calls
	}
	return calls, err
}

// commandStat is one line of INFO commandstats: calls, and microseconds
// spent in them (a script's own commands included in its time).
type commandStat struct{ calls, usec int64 }

func commandStats(ctx context.Context, rdb *redis.Client) (map[string]commandStat, error) {
	text, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, err
	}
	stats := map[string]commandStat{}
	for line := range strings.SplitSeq(text, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var st commandStat
		for field := range strings.SplitSeq(rest, ",") {
			if v, ok := strings.CutPrefix(field, "calls="); ok {
				st.calls, _ = strconv.ParseInt(v, 10, 64)
			}
			if v, ok := strings.CutPrefix(field, "usec="); ok {
				st.usec, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		stats[strings.TrimPrefix(name, "cmdstat_")] = st
	}
	return stats, nil
}

// commandTime is the microseconds per request that Redis spent running
// commands between two readings of commandStats: in scripts (EVAL,
// EVALSHA, FCALL: the commands they run included), and in every other
// command, whether a script or the client sent it.
func commandTime(before, after map[string]commandStat, requests int64) (scripts, commands float64) {
	if requests <= 0 {
		return 0, 0
	}
	var script, other int64
	for name, st := range after {
		if notServed(name) {
			continue
		}
		d := st.usec - before[name].usec
		switch name {
		case "evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro":
			script += d
		default:
			other += d
		}
	}
	return float64(script) / float64(requests), float64(other) / float64(requests)
}

// notServed are commands that are not part of serving a request: the
// driver's own (INFO, the ECHO markers) and a connection's set-up.
func notServed(name string) bool {
	switch name {
	case "info", "echo", "monitor", "hello", "auth", "select", "flushall":
		return true
	}
	return strings.HasPrefix(name, "client")
}

// callsDelta is after minus before, per command, without notServed.
func callsDelta(before, after map[string]int64) (map[string]int64, int64) {
	delta := map[string]int64{}
	var total int64
	for name, n := range after {
		if d := n - before[name]; d > 0 && !notServed(name) {
			delta[name] = d
			total += d
		}
	}
	return delta, total
}

// monitorLines runs step and returns what MONITOR showed meanwhile, each
// line as monitorLine renders it.
func monitorLines(ctx context.Context, mon *redistest.Monitor, rdb *redis.Client, step func() error) ([]string, error) {
	lines, err := mon.Lines(ctx, rdb, func() error {
		if err := step(); err != nil {
			return err
		}
		time.Sleep(50 * time.Millisecond) // anything a server sends after answering
		return nil
	})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, line := range lines {
		if l := monitorLine(line); l != "" {
			out = append(out, l)
		}
	}
	return out, nil
}

// monitorLine turns `1700000000.1 [0 127.0.0.1:5000] "evalsha" "…"` into
// `evalsha …` or, for a script's own command, `  lua: set …`, with long
// arguments (hashes, tokens, stored answers) cut short.
func monitorLine(line string) string {
	_, rest, _ := strings.Cut(line, "[")
	who, args, _ := strings.Cut(rest, "]")
	fields := splitQuoted(strings.TrimSpace(args))
	if len(fields) == 0 || notServed(strings.ToLower(fields[0])) {
		return ""
	}
	s := describe(fields)
	if strings.HasSuffix(who, " lua") {
		return "  lua: " + s
	}
	return s
}

// splitQuoted splits MONITOR's "a" "b\"c" argument list.
func splitQuoted(s string) []string {
	var out []string
	for len(s) > 0 {
		if s[0] != '"' {
			s = s[1:]
			continue
		}
		var b strings.Builder
		i := 1
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] == '\\' && i+1 < len(s) {
				i++
			}
			b.WriteByte(s[i])
		}
		out = append(out, b.String())
		if i >= len(s) {
			break
		}
		s = s[i+1:]
	}
	return out
}

// describe is a command with its arguments cut to a readable length.
func describe(args []string) string {
	parts := make([]string, 0, len(args))
	for i, a := range args {
		switch {
		case i == 0:
			a = strings.ToLower(a)
		case !printable(a):
			a = fmt.Sprintf("<%d bytes>", len(a))
		case len(a) > 24:
			a = a[:12] + "…"
		}
		parts = append(parts, a)
		if i == 6 && len(args) > 8 {
			parts = append(parts, fmt.Sprintf("(+%d more)", len(args)-7))
			break
		}
	}
	return strings.Join(parts, " ")
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// A tripCounter is a TCP proxy in front of Redis that counts round trips:
// a round trip begins when a client sends after its last reply, so the
// commands of one pipeline are one round trip, as they are on the wire.
// MONITOR cannot tell a pipeline from commands sent one by one.
type tripCounter struct {
	l      net.Listener
	target string

	mu      sync.Mutex
	trips   int64      // round trips that served requests
	setup   int64      // round trips of a connection's set-up (HELLO, CLIENT …)
	logging bool       // keep each round trip's commands in log
	log     [][]string // while logging: the commands of each round trip
	conns   []net.Conn
}

func startTripCounter(target string) (*tripCounter, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &tripCounter{l: l, target: target}
	go p.accept()
	return p, nil
}

func (p *tripCounter) addr() string { return p.l.Addr().String() }

func (p *tripCounter) close() {
	p.l.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
}

func (p *tripCounter) accept() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		s, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		go p.relay(c, s)
	}
}

// relay copies both ways. Client bytes sent while no reply has come back
// belong to the same round trip; the first reply bytes close it. The state
// changes before the bytes are passed on, so that a client that sends at
// once on a reply is seen in order.
func (p *tripCounter) relay(c, s net.Conn) {
	var (
		mu          sync.Mutex
		outstanding bool
		sent        []byte
	)
	finish := func() {
		if !outstanding {
			return
		}
		outstanding = false
		p.record(commandsIn(sent))
		sent = sent[:0]
	}
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := s.Read(buf)
			if n > 0 {
				mu.Lock()
				finish()
				mu.Unlock()
				if _, werr := c.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		c.Close()
		s.Close()
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			mu.Lock()
			outstanding = true
			sent = append(sent, buf[:n]...)
			mu.Unlock()
			if _, werr := s.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	c.Close()
	s.Close()
}

func (p *tripCounter) record(cmds [][]string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	setupOnly := len(cmds) > 0
	for _, c := range cmds {
		if !notServed(strings.ToLower(c[0])) {
			setupOnly = false
		}
	}
	if setupOnly {
		p.setup++
		return
	}
	p.trips++
	if p.logging {
		var names []string
		for _, c := range cmds {
			names = append(names, describe(c))
		}
		p.log = append(p.log, names)
	}
}

func (p *tripCounter) count() (trips, setup int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.trips, p.setup
}

func (p *tripCounter) startLog() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.logging, p.log = true, nil
}

func (p *tripCounter) stopLog() [][]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.logging = false
	return p.log
}

// commandsIn parses the RESP arrays a client sent: one per command.
func commandsIn(b []byte) [][]string {
	r := bufio.NewReader(bytes.NewReader(b))
	var cmds [][]string
	for {
		line, err := r.ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "*") {
			return cmds
		}
		n, _ := strconv.Atoi(strings.TrimSpace(line[1:]))
		var cmd []string
		for range n {
			head, err := r.ReadString('\n')
			if err != nil || !strings.HasPrefix(head, "$") {
				return cmds
			}
			size, _ := strconv.Atoi(strings.TrimSpace(head[1:]))
			arg := make([]byte, size+2)
			if _, err := io.ReadFull(r, arg); err != nil {
				return cmds
			}
			cmd = append(cmd, string(arg[:size]))
		}
		if len(cmd) > 0 {
			cmds = append(cmds, cmd)
		}
	}
}
