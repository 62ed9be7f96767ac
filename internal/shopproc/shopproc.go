// Package shopproc runs the example shop as the separate program it is, for
// end-to-end tests: it builds the binary, starts instances on free loopback
// ports, waits until they answer, and stops them when the test ends.
package shopproc

import (
	"crypto/rand"
	"encoding/base64"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/syncbuf"
)

// Build compiles the example into dir, under the race detector when race is
// set, and returns the binary's path.
func Build(t testing.TB, dir string, race bool) string {
	t.Helper()
	bin := filepath.Join(dir, "shop")
	// No VCS stamp: a test binary needs none, and a checkout without the
	// git binary (a bare machine) would fail to build with one.
	args := []string{"build", "-buildvcs=false", "-o", bin}
	if race {
		args = append(args, "-race")
	}
	out, err := exec.Command("go", append(args, "github.com/onceonly/idempotency/example")...).CombinedOutput()
	if err != nil {
		t.Fatalf("shopproc: go build ./example: %v\n%s", err, out)
	}
	return bin
}

// tokenKeys is the key ring every shop of this test process shares, as the
// instances of one deployment do: a form issued by one is spent on another,
// and after a restart.
var tokenKeys = sync.OnceValue(func() string {
	key := make([]byte, 32)
	rand.Read(key)
	return "sign=" + base64.RawURLEncoding.EncodeToString(key)
})

// A Shop is one running instance of the example.
type Shop struct {
	URL    string          // http://127.0.0.1:PORT
	Out    *syncbuf.Buffer // what it wrote to stdout and stderr
	proc   *os.Process
	exited chan struct{}
}

// Signal sends sig to the shop's process.
func (s *Shop) Signal(sig os.Signal) error { return s.proc.Signal(sig) }

// Exited is closed when the shop's process has exited.
func (s *Shop) Exited() <-chan struct{} { return s.exited }

// Start runs bin on a free loopback port with env added to this process's
// environment (later entries win: pass REDIS_URL and the like), and returns
// once GET ready (a path, "/orders") answers 200. It fails the test when the
// shop exits or stays silent for longer than within. When t ends the shop gets SIGTERM,
// and SIGKILL if it has not stopped 10 s later; its output is logged when
// the test failed.
func Start(t testing.TB, bin, ready string, within time.Duration, env ...string) *Shop {
	t.Helper()
	addr := freeAddr(t)
	s := &Shop{URL: "http://" + addr, Out: &syncbuf.Buffer{}}
	cmd := exec.Command(bin)
	cmd.Env = append(append(os.Environ(), "ADDR="+addr, "REDIS_CLUSTER_ADDRS=", "IDEMPOTENCY_TOKEN_KEYS="+tokenKeys()), env...)
	cmd.Stdout, cmd.Stderr = s.Out, s.Out
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		t.Fatalf("shopproc: %v", err)
	}
	exited := make(chan struct{})
	s.proc, s.exited = cmd.Process, exited
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("shop %s output:\n%s", addr, s.Out)
		}
	})

	deadline := time.Now().Add(within)
	for {
		if resp, err := http.Get(s.URL + ready); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s
			}
		}
		select {
		case <-exited:
			t.Fatalf("shopproc: the shop exited at start-up:\n%s", s.Out)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("shopproc: the shop did not answer within %v:\n%s", within, s.Out)
		}
	}
}

func freeAddr(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("shopproc: %v", err)
	}
	defer l.Close()
	return l.Addr().String()
}
