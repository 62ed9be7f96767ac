//go:build linux

package main

import (
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// buildServer compiles this directory's server into dir.
func buildServer(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "crashtrial")
	out, err := exec.Command("go", "build", "-buildvcs=false", "-o", bin,
		"github.com/onceonly/idempotency/example/internal/crashtrial").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// An instance is one server, restarted on its address whenever it dies
// (keepAlive) until stop.
type instance struct {
	url  string
	bin  string
	env  []string
	logs *os.File // stdout and stderr of every life, appended

	up       atomic.Bool
	lives    atomic.Int64
	mu       sync.Mutex
	proc     *os.Process
	stopping atomic.Bool
	done     chan struct{}
}

func newInstance(t *testing.T, bin, name string, env ...string) *instance {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	logs, err := os.Create(filepath.Join(t.TempDir(), name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	in := &instance{url: "http://" + addr, bin: bin, logs: logs, done: make(chan struct{}),
		env: append(append(os.Environ(), "DATABASE_URL=", "DB_PATH="), append(env, "ADDR="+addr)...)}
	t.Cleanup(func() { in.stop(); logs.Close() })
	return in
}

// start runs one life of the server and waits until it answers, or dies.
func (in *instance) start() (exited chan struct{}, err error) {
	cmd := exec.Command(in.bin)
	in.mu.Lock()
	cmd.Env = in.env
	in.mu.Unlock()
	cmd.Stdout, cmd.Stderr = in.logs, in.logs
	// Dies with the test binary, even when a -timeout panic skips the
	// cleanups.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	in.lives.Add(1)
	in.mu.Lock()
	in.proc = cmd.Process
	if in.stopping.Load() {
		cmd.Process.Kill() // stop ran between two lives
	}
	in.mu.Unlock()
	exited = make(chan struct{})
	go func() { cmd.Wait(); in.up.Store(false); close(exited) }()
	client := &http.Client{Timeout: time.Second}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		select {
		case <-exited:
			return exited, nil // killed at start-up: the caller starts it again
		default:
		}
		if resp, err := client.Get(in.url + "/accounts"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				in.up.Store(true)
				return exited, nil
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	cmd.Process.Kill()
	return exited, errNotReady
}

var errNotReady = errors.New("the server did not answer GET /accounts within 30s")

// keepAlive starts the server, and again each time it dies, until stop.
// It returns once the first life answers.
func (in *instance) keepAlive(t *testing.T) {
	t.Helper()
	exited, err := in.start()
	if err != nil {
		t.Fatalf("the server did not start: %v", err)
	}
	go func() {
		defer close(in.done)
		for {
			<-exited
			if in.stopping.Load() {
				return
			}
			if exited, err = in.start(); err != nil {
				return
			}
		}
	}()
}

// setEnv sets name to value in the environment of the server's next
// lives.
func (in *instance) setEnv(name, value string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.env = append(slices.DeleteFunc(slices.Clone(in.env), func(kv string) bool {
		return strings.HasPrefix(kv, name+"=")
	}), name+"="+value)
}

// kill sends SIGKILL to the running life, reporting whether one was up.
func (in *instance) kill() bool {
	if !in.up.Load() {
		return false
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.proc.Signal(syscall.SIGKILL) == nil
}

// stop kills the server for good and waits for its keeper.
func (in *instance) stop() {
	if in.stopping.Swap(true) {
		return
	}
	in.mu.Lock()
	if in.proc != nil {
		in.proc.Signal(syscall.SIGKILL)
	}
	in.mu.Unlock()
	select {
	case <-in.done:
	case <-time.After(10 * time.Second):
	}
}
