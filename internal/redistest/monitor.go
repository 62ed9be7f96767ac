package redistest

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
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
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("redistest: monitor: %v", err)
	}
	r := bufio.NewReader(conn)
	conn.Write([]byte("MONITOR\r\n"))
	if ok, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(ok, "+OK") {
		t.Fatalf("redistest: MONITOR answered %q, %v", ok, err)
	}
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
	t.Cleanup(func() { conn.Close() })
	return m
}

// Count runs step and returns the commands clients sent meanwhile, by name,
// leaving out connection handshakes (HELLO, CLIENT …) that a pool makes once.
func (m *Monitor) Count(t testing.TB, rdb *redis.Client, step func()) []string {
	t.Helper()
	start := m.mark(t, rdb)
	step()
	end := m.mark(t, rdb)
	m.mu.Lock()
	defer m.mu.Unlock()
	var cmds []string
	for _, line := range m.lines[start+1 : end] {
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

// mark sends a unique ECHO and returns the index of its monitor line.
func (m *Monitor) mark(t testing.TB, rdb *redis.Client) int {
	t.Helper()
	b := make([]byte, 8)
	rand.Read(b)
	marker := "monitor-mark-" + hex.EncodeToString(b)
	if err := rdb.Echo(context.Background(), marker).Err(); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	deadline := time.After(5 * time.Second)
	for {
		m.mu.Lock()
		for i := len(m.lines) - 1; i >= 0; i-- {
			if strings.Contains(m.lines[i], marker) {
				m.mu.Unlock()
				return i
			}
		}
		m.mu.Unlock()
		select {
		case <-m.notify:
		case <-deadline:
			t.Fatalf("redistest: monitor never saw its marker")
		}
	}
}
