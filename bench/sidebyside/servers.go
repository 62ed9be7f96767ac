package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/onceonly/idempotency/bench/peers/peer"
	"github.com/onceonly/idempotency/internal/redistest"
)

// A kind is one of the compared servers.
type kind struct {
	Name      string `json:"name"`
	Title     string `json:"title"`
	What      string `json:"what"`
	Package   string `json:"package"`
	UsesRedis bool   `json:"uses_redis"`
	// Replay tells whether a duplicate's answer is a replay of first.
	Replay func(resp *http.Response, body, first []byte) bool `json:"-"`
	// ReplayHeader marks a replay in an answer; "" for this library's.
	ReplayHeader string `json:"-"`
	// UsesPostgres: the server keeps its keys in PostgreSQL (see
	// postgres.go), on a table of its own.
	UsesPostgres bool `json:"uses_postgres,omitempty"`
	// source is, for a server that no module of the repository builds,
	// its file in the bench module, and tree the tree of what it
	// requires, stores the modules of that tree it needs besides its
	// root (in folders of the same names) and pins the modules it
	// requires at the bench module's versions (see idemlease.go).
	source, tree string
	stores, pins []string
}

var kinds = []kind{
	{
		Name: "ours", Title: "this library",
		What:      "idempotency.New(rdb, WithCallerCredentials()).ProtectKey, go-redis PoolSize 64, ContextTimeoutEnabled",
		Package:   "github.com/onceonly/idempotency/bench/peers/ours",
		UsesRedis: true,
		Replay:    replayedByUs,
	},
	{
		Name: "floor", Title: "the floor",
		What: "bench/peers/floor: redislock with a four-command claim riding in its pipeline, a lease timer, " +
			"a fence and a fingerprint, and one completion script; a record is one string. The fewest " +
			"commands the guarantees allow, not a product (no waiting, no recovery, one header)",
		Package:   "github.com/onceonly/idempotency/bench/peers/floor",
		UsesRedis: true,
		Replay:    replayedByUs,
	},
	{
		Name: "lease", Title: "lease in record",
		What: "bench/peers/lease: a middleware of github.com/repenguin22/idemlease's shape, from its documentation: " +
			"no separate lock, a hash record holding a 128-bit lease token (reserve: EXISTS, else HSET and PEXPIRE; " +
			"complete: the token compared, HSET and PEXPIRE), a SHA-256 fingerprint, 409 while a key runs, " +
			"fail-closed; no lease renewal, no fence, no waiting, no in-process cache",
		Package:   "github.com/onceonly/idempotency/bench/peers/lease",
		UsesRedis: true,
		Replay: func(resp *http.Response, body, first []byte) bool {
			return resp.Header.Get("Idempotency-Replayed") == "true" && string(body) == string(first)
		},
		ReplayHeader: "Idempotency-Replayed",
	},
	{
		Name: "fiber", Title: "Fiber",
		What: "Fiber v3 middleware/idempotency with storage/redis/v3 (PoolSize 64); KeyHeader Idempotency-Key, " +
			"KeyHeaderValidate 1–255 bytes, all else as shipped (its lock is in process memory)",
		Package:   "github.com/onceonly/idempotency/bench/peers/fiber",
		UsesRedis: true,
		Replay: func(resp *http.Response, body, first []byte) bool {
			return string(body) == string(first) // Fiber marks no replay in the answer
		},
	},
	{
		Name: "bare", Title: "net/http alone",
		What:    "the same handler on net/http, no middleware",
		Package: "github.com/onceonly/idempotency/bench/peers/bare",
	},
}

// replayHeader is the header by which k marks a replay.
func (k kind) replayHeader() string {
	if k.ReplayHeader == "" {
		return "Idempotent-Replayed"
	}
	return k.ReplayHeader
}

// replayedByUs: this library marks a replay, and replays first's body.
func replayedByUs(resp *http.Response, body, first []byte) bool {
	return resp.Header.Get("Idempotent-Replayed") == "true" && string(body) == string(first)
}

// binary is the file `go build -o DIR/` writes a kind's command to.
func (k kind) binary(dir string) string { return filepath.Join(dir, path.Base(k.Package)) }

// children are the processes this run started; stopChildren ends those
// still running.
var children []*exec.Cmd

func startChild(ctx context.Context, name string, args ...string) (*exec.Cmd, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	cmd := exec.Command(name, args...)
	// A child dies with the driver, even when the driver is killed before
	// it can stop them (main keeps to one OS thread for this), and has its
	// own process group: a Ctrl-C reaches the driver, which stops it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	children = append(children, cmd)
	return cmd, nil
}

func stopChild(cmd *exec.Cmd) {
	if cmd.ProcessState == nil {
		cmd.Process.Kill()
		cmd.Wait()
	}
}

func stopChildren() {
	for _, c := range children {
		stopChild(c)
	}
	children = nil
}

// buildServers compiles every kind once into dir and returns each binary's
// module versions, as `go version -m` reads them from the binary.
func buildServers(ctx context.Context, dir string) (map[string]map[string]string, error) {
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	for _, k := range kinds {
		if k.source == "" && !slices.Contains(args, k.Package) {
			args = append(args, k.Package)
		}
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go %s: %w", strings.Join(args, " "), err)
	}
	for _, k := range kinds {
		if k.source != "" {
			if err := buildIdemlease(ctx, dir, k); err != nil {
				return nil, err
			}
		}
	}
	versions := map[string]map[string]string{}
	for _, k := range kinds {
		out, err := exec.CommandContext(ctx, "go", "version", "-m", k.binary(dir)).Output()
		if err != nil {
			return nil, fmt.Errorf("go version -m %s: %w", k.Name, err)
		}
		versions[k.Name] = buildInfo(string(out))
	}
	return versions, nil
}

// buildInfo keeps the go version, the modules and the VCS stamp of `go
// version -m` output.
func buildInfo(out string) map[string]string {
	info := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 2 && strings.HasSuffix(f[0], ":"):
			info["go"] = f[1]
		case len(f) >= 3 && (f[0] == "dep" || f[0] == "mod"):
			info[f[1]] = f[2]
		case len(f) == 2 && f[0] == "build" && strings.HasPrefix(f[1], "vcs."):
			k, v, _ := strings.Cut(f[1], "=")
			info[k] = v
		}
	}
	return info
}

// An instance is one running server.
type instance struct {
	kind kind
	name string
	base string // http://127.0.0.1:port
	cmd  *exec.Cmd
}

func startInstance(ctx context.Context, dir string, k kind, name, redisAddr string, lifetime time.Duration) (*instance, error) {
	port, err := redistest.FreePort()
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	args := []string{"-addr", addr, "-for", lifetime.String(), "-instance", name}
	if k.UsesRedis {
		args = append(args, "-redis", redisAddr)
	}
	if k.UsesPostgres {
		args = append(args, "-postgres", pg.dsnFor(k.Name+"-"+name), "-table", pg.tables[k.Name])
	}
	cmd, err := startChild(ctx, k.binary(dir), args...)
	if err != nil {
		return nil, err
	}
	in := &instance{kind: k, name: name, base: "http://" + addr, cmd: cmd}
	deadline := time.Now().Add(15 * time.Second)
	for {
		if _, err := in.stats(); err == nil {
			return in, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			stopChild(cmd)
			return nil, fmt.Errorf("%s (%s) did not answer on %s", k.Name, name, addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (in *instance) stop() { stopChild(in.cmd) }

func (in *instance) url() string { return in.base + peer.Path }

func (in *instance) stats() (peer.Stats, error) {
	var s peer.Stats
	resp, err := client.Get(in.base + peer.StatsPath)
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("stats: %s", resp.Status)
	}
	return s, json.NewDecoder(resp.Body).Decode(&s)
}

var client = &http.Client{Timeout: 10 * time.Second}

// post sends one protected request with key and returns the answer.
func post(url, key string) (*http.Response, []byte, error) {
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"amount":1}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, body, err
}
