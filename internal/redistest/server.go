package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a Redis the tests talk to; Stop ends it when this package
// started it.
type Server struct {
	opts     *redis.Options
	cmd      *exec.Cmd
	dir      string
	stopOnce sync.Once
}

// Options returns client options for the server, with context deadlines
// honoured as the middleware's documentation asks.
func (s *Server) Options() *redis.Options {
	o := *s.opts
	o.ContextTimeoutEnabled = true
	return &o
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return s.opts.Addr }

// Client returns a new client for the server, closed when t ends.
func (s *Server) Client(t interface{ Cleanup(func()) }) *redis.Client {
	c := redis.NewClient(s.Options())
	t.Cleanup(func() { c.Close() })
	return c
}

// Signal sends sig to the redis-server process (SIGSTOP, SIGCONT, SIGKILL).
func (s *Server) Signal(sig syscall.Signal) error {
	if s.cmd == nil {
		return fmt.Errorf("redistest: not a process of ours")
	}
	return s.cmd.Process.Signal(sig)
}

var (
	startedMu sync.Mutex
	started   []*Server
)

func track(s *Server) {
	startedMu.Lock()
	started = append(started, s)
	startedMu.Unlock()
}

func stopAll() {
	startedMu.Lock()
	defer startedMu.Unlock()
	for _, s := range started {
		s.Stop()
	}
	started = nil
}

// StartServer starts a private redis-server on a free loopback port with no
// persistence. Extra args are appended to its command line.
func StartServer(args ...string) (*Server, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	return startOnPort(port, args...)
}

func startOnPort(port int, args ...string) (*Server, error) {
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		return nil, err
	}
	argv := append([]string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir,
		"--daemonize", "no", "--logfile", dir + "/redis.log",
	}, args...)
	cmd := exec.Command("redis-server", argv...)
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("starting redis-server: %w", err)
	}
	s := &Server{opts: &redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(port)}, cmd: cmd, dir: dir}
	track(s)
	if err := s.waitReady(10 * time.Second); err != nil {
		s.Stop()
		log, _ := os.ReadFile(dir + "/redis.log")
		return nil, fmt.Errorf("redis-server on port %d: %w\n%s", port, err, log)
	}
	return s, nil
}

func (s *Server) waitReady(limit time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: s.opts.Addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(limit)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Stop kills the server and removes its directory.
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		if s.cmd != nil {
			s.cmd.Process.Kill()
			s.cmd.Wait()
		}
		if s.dir != "" {
			os.RemoveAll(s.dir)
		}
	})
}

// FreePort asks the kernel for a free loopback port.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Restart starts a new server on the port of s, which must have stopped
// (killed, say): what a supervisor does after a crash. It is stopped when t
// ends.
func Restart(t interface {
	Cleanup(func())
	Fatalf(string, ...any)
}, s *Server) *Server {
	_, port, _ := net.SplitHostPort(s.Addr())
	p, _ := strconv.Atoi(port)
	s.Stop()
	var again *Server
	var err error
	for range 50 { // the old process may hold the port for a moment
		if again, err = startOnPort(p); err == nil {
			t.Cleanup(again.Stop)
			return again
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("redistest: restarting on port %d: %v", p, err)
	return nil
}
