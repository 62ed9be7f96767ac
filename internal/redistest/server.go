package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
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

// Signal sends sig to the server's process (SIGSTOP, SIGCONT, SIGKILL).
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

// ServerCommand is the program the tests start as a Redis server:
// IDEMPOTENCY_REDIS_SERVER when set, else redis-server from PATH. The test
// command points it at a wrapper that runs Redis 8.0 or Valkey 8.1 out of a
// Debian trixie root (docs/testing.md); whatever it names must take
// redis-server's command line.
func ServerCommand() string {
	if cmd := os.Getenv("IDEMPOTENCY_REDIS_SERVER"); cmd != "" {
		return cmd
	}
	return "redis-server"
}

// SentinelCommand is the program and leading arguments that start a Redis
// Sentinel from a config file: IDEMPOTENCY_REDIS_SENTINEL when set; else,
// when IDEMPOTENCY_REDIS_SERVER names the server, that server in sentinel
// mode, so that Sentinel is tested in the server's own version; else
// redis-sentinel from PATH. The config file's path follows the program.
func SentinelCommand() (program string, sentinelMode bool) {
	if cmd := os.Getenv("IDEMPOTENCY_REDIS_SENTINEL"); cmd != "" {
		return cmd, false
	}
	if cmd := os.Getenv("IDEMPOTENCY_REDIS_SERVER"); cmd != "" {
		return cmd, true
	}
	return "redis-sentinel", false
}

// StartServer starts a private Redis server (ServerCommand) on a free
// loopback port with no persistence. Extra args are appended to its command
// line.
func StartServer(args ...string) (*Server, error) {
	return StartProgram(ServerCommand(), args...)
}

// StartProgram is StartServer with program in place of ServerCommand, for
// code that starts several kinds of server in one process (the benchmark's
// server matrix).
func StartProgram(program string, args ...string) (*Server, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	return programOnPort(program, port, args...)
}

func startOnPort(port int, args ...string) (*Server, error) {
	return programOnPort(ServerCommand(), port, args...)
}

func programOnPort(program string, port int, args ...string) (*Server, error) {
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		return nil, err
	}
	argv := append([]string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir,
		"--daemonize", "no", "--logfile", dir + "/redis.log",
	}, args...)
	return start(program, port, dir, argv)
}

// start runs program with argv as a server listening on port, logging to
// dir/redis.log, and waits until it answers PING.
func start(program string, port int, dir string, argv []string) (*Server, error) {
	cmd := exec.Command(program, argv...)
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("starting %s: %w", program, err)
	}
	s := &Server{opts: &redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(port)}, cmd: cmd, dir: dir}
	track(s)
	if err := s.waitReady(10 * time.Second); err != nil {
		s.Stop()
		log, _ := os.ReadFile(dir + "/redis.log")
		return nil, fmt.Errorf("%s on port %d: %w\n%s", program, port, err, log)
	}
	return s, nil
}

// Version names the server and its version as it reports them in INFO
// server: "Valkey 8.1.1" (valkey_version), else "Redis 7.0.15"
// (redis_version, which Valkey also reports, as the Redis version it is
// compatible with).
func Version(ctx context.Context, rdb redis.Cmdable) (string, error) {
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return "", err
	}
	fields := map[string]string{}
	for line := range strings.SplitSeq(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			fields[k] = v
		}
	}
	switch {
	case fields["valkey_version"] != "":
		return "Valkey " + fields["valkey_version"], nil
	case fields["redis_version"] != "":
		return "Redis " + fields["redis_version"], nil
	}
	return "", fmt.Errorf("INFO server names no version")
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
