package redistest

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Monitor counts the commands clients send to a server, through MONITOR:
// unlike INFO commandstats it tells a client's command (one round trip) from
// the commands a Lua script runs inside the server.
type Monitor struct {
	conn   net.Conn
	mu     sync.Mutex
	lines  []string
	notify chan struct{}
}

// StartMonitor attaches a monitor to the server at addr until t ends.
func StartMonitor(t testing.TB, addr string) *Monitor {
	t.Helper()
	m, err := AttachMonitor(addr)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(m.Close)
	return m
}

// AttachMonitor attaches a monitor to the server at addr, for code that has
// no testing.TB (the benchmark driver); Close ends it.
func AttachMonitor(addr string) (*Monitor, error) {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("monitor: %w", err)
	}
	r := bufio.NewReader(conn)
	conn.Write([]byte("MONITOR\r\n"))
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if ok, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(ok, "+OK") {
		conn.Close()
		return nil, fmt.Errorf("MONITOR answered %q, %v", ok, err)
	}
	conn.SetReadDeadline(time.Time{})
	m := &Monitor{conn: conn, notify: make(chan struct{}, 1)}
	go func() {
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			m.mu.Lock()
			m.lines = append(m.lines, strings.TrimSpace(line))
			m.mu.Unlock()
			select {
			case m.notify <- struct{}{}:
			default:
			}
		}
	}()
	return m, nil
}

// Close detaches the monitor.
func (m *Monitor) Close() { m.conn.Close() }

// Count runs step and returns the commands clients sent meanwhile, by name,
// leaving out connection handshakes (HELLO, CLIENT …) that a pool makes once.
func (m *Monitor) Count(t testing.TB, rdb *redis.Client, step func()) []string {
	t.Helper()
	lines, err := m.Lines(context.Background(), rdb, func() error { step(); return nil })
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	var cmds []string
	for _, line := range lines {
		// +1700000000.123456 [0 127.0.0.1:50000] "evalsha" "…"; a script's
		// own commands show [0 lua].
		_, rest, _ := strings.Cut(line, "[")
		who, args, _ := strings.Cut(rest, "]")
		if strings.HasSuffix(who, " lua") {
			continue
		}
		name := strings.ToLower(strings.Trim(strings.Fields(args)[0], `"`))
		if name == "hello" || name == "client" || name == "echo" {
			continue
		}
		cmds = append(cmds, name)
	}
	return cmds
}

// Lines runs step between two ECHO markers sent through rdb and returns the
// monitor lines in between, as MONITOR printed them: what clients sent, and
// (marked "lua") what scripts ran.
func (m *Monitor) Lines(ctx context.Context, rdb *redis.Client, step func() error) ([]string, error) {
	start, err := m.mark(ctx, rdb)
	if err != nil {
		return nil, err
	}
	if err := step(); err != nil {
		return nil, err
	}
	end, err := m.mark(ctx, rdb)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.lines[start+1 : end]), nil
}

// mark sends a unique ECHO and returns the index of its monitor line.
func (m *Monitor) mark(ctx context.Context, rdb *redis.Client) (int, error) {
	b := make([]byte, 8)
	rand.Read(b)
	marker := "monitor-mark-" + hex.EncodeToString(b)
	if err := rdb.Echo(ctx, marker).Err(); err != nil {
		return 0, err
	}
	deadline := time.After(5 * time.Second)
	for {
		m.mu.Lock()
		for i := len(m.lines) - 1; i >= 0; i-- {
			if strings.Contains(m.lines[i], marker) {
				m.mu.Unlock()
				return i, nil
			}
		}
		m.mu.Unlock()
		select {
		case <-m.notify:
		case <-deadline:
			return 0, errors.New("MONITOR never showed its marker")
		}
	}
}
