package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// The server matrix: this library alone, on each of several Redis servers
// (Redis 7.0, Redis 8.0, Valkey 8.1), under the same load in the same
// interleaved rounds, for what the servers change: first executions per
// second, and the CPU and command time Redis spends per request. The
// protocol is the same on all of them, so round trips and commands per
// request are too, and are not counted again here.

// A redisServer is one -server choice.
type redisServer struct {
	Name    string `json:"name"`
	Version string `json:"version"` // from its INFO server
	program string
}

var serverNames = []string{"redis7", "redis8", "valkey8"}

// redisServers resolves -server: redis7 is redis-server from PATH; redis8
// and valkey8 are the wrappers scripts/trixie.sh writes into trixie.
func redisServers(list, trixie string) ([]redisServer, error) {
	var servers []redisServer
	for name := range strings.SplitSeq(list, ",") {
		name = strings.TrimSpace(name)
		if !slices.Contains(serverNames, name) {
			return nil, fmt.Errorf("-server: %q is not one of %s", name, strings.Join(serverNames, ", "))
		}
		if slices.ContainsFunc(servers, func(s redisServer) bool { return s.Name == name }) {
			return nil, fmt.Errorf("-server: %s named twice", name)
		}
		program := "redis-server"
		if name != "redis7" {
			program = filepath.Join(trixie, name+"-server")
		}
		servers = append(servers, redisServer{Name: name, program: program})
	}
	return servers, nil
}

// defaultTrixieBin is where scripts/trixie.sh writes its wrappers.
func defaultTrixieBin() string {
	dir, err := os.UserCacheDir() // $XDG_CACHE_HOME, else ~/.cache
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "idempotency", "bin")
}

func lookTools(cfg config) error {
	for _, tool := range []string{"wrk", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s is needed (apt-get install -y wrk)", tool)
		}
	}
	for _, s := range cfg.servers {
		if _, err := exec.LookPath(s.program); err != nil {
			if s.Name == "redis7" {
				return fmt.Errorf("redis-server is needed (apt-get install -y redis-server)")
			}
			return fmt.Errorf("%s: %s is not there; ./scripts/trixie.sh builds it", s.Name, s.program)
		}
	}
	return nil
}

// matrixReport is the JSON the matrix writes.
type matrixReport struct {
	Date    string        `json:"date"`
	Machine machine       `json:"machine"`
	Go      string        `json:"go_version"`
	Wrk     string        `json:"wrk_version"`
	Library string        `json:"library"`
	GoRedis string        `json:"go_redis"`
	Servers []redisServer `json:"servers"`
	Load    load          `json:"load"`
	Runs    []matrixRun   `json:"runs"`
	Medians []median      `json:"medians"` // Server: the Redis server's name
	Seconds float64       `json:"seconds"`
}

type matrixRun struct {
	Redis string `json:"redis"`
	run
}

func runMatrix(ctx context.Context, cfg config) (err error) {
	defer func() { err = withCause(ctx, err) }()
	dir, scripts, cleanup, err := prepare(cfg, map[string][]byte{"first": newkeyLua})
	if err != nil {
		return err
	}
	defer cleanup()
	script := scripts["first"]
	started := time.Now()
	log.Printf("building the server")
	builds, err := buildServers(ctx, dir)
	if err != nil {
		return err
	}
	ours := kinds[0]
	lifetime := cfg.timeout + time.Minute
	rep := &matrixReport{
		Date:    time.Now().UTC().Format(time.RFC3339),
		Machine: machine{CPU: cpuModel(), Cores: runtime.NumCPU(), Note: "the server, Redis and wrk share the cores"},
		Go:      runtime.Version(),
		Wrk:     wrkVersion(),
		Library: libraryState(ctx),
		GoRedis: builds[ours.Name]["github.com/redis/go-redis/v9"],
		Load: load{
			Measured: "wrk " + strings.Join(wrkArgs(cfg.threads, cfg.conns, cfg.duration, true, "SCRIPT", "URL", "ARG"), " "),
			Warmup:   "wrk " + strings.Join(wrkArgs(cfg.threads, cfg.conns, cfg.warmup, false, "SCRIPT", "URL", "ARG"), " "),
			Rounds:   cfg.rounds,
			Order:    "round r starts with Redis server r; each server's run starts on an emptied Redis",
			First:    "bench/sidebyside/newkey.lua: POST /payments, a new Idempotency-Key per request (ARG: a prefix per round)",
		},
	}
	rdbs := map[string]*redis.Client{}
	insts := map[string]*instance{}
	for i, s := range cfg.servers {
		srv, err := redistest.StartProgram(s.program)
		if err != nil {
			return fmt.Errorf("%s: %w", s.Name, err)
		}
		defer srv.Stop()
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
		defer rdb.Close()
		if cfg.servers[i].Version, err = redistest.Version(ctx, rdb); err != nil {
			return fmt.Errorf("%s: %w", s.Name, err)
		}
		log.Printf("%s: %s on %s", s.Name, cfg.servers[i].Version, srv.Addr())
		in, err := startInstance(ctx, dir, ours, s.Name, srv.Addr(), lifetime)
		if err != nil {
			return err
		}
		defer in.stop()
		rdbs[s.Name], insts[s.Name] = rdb, in
	}
	rep.Servers = cfg.servers

	log.Printf("first executions: %d rounds × %d Redis servers", cfg.rounds, len(cfg.servers))
	for round := 1; round <= cfg.rounds; round++ {
		n := (round - 1) % len(cfg.servers)
		for _, s := range slices.Concat(cfg.servers[n:], cfg.servers[:n]) {
			if err := rdbs[s.Name].FlushAll(ctx).Err(); err != nil {
				return err
			}
			r, err := measure(ctx, cfg, ours, insts[s.Name], redisMeter(rdbs[s.Name]), round, "first", script)
			if err != nil {
				return err
			}
			rep.Runs = append(rep.Runs, matrixRun{Redis: s.Name, run: r})
			log.Printf("  round %d %-8s %8.0f req/s  Redis %5.1f µs CPU per request  %s",
				round, s.Name, r.RPS, r.RedisCPU, map[bool]string{true: "ok", false: "NOT OK: " + r.Problem}[r.OK])
		}
	}
	for _, s := range cfg.servers {
		m := median{Server: s.Name, Workload: "first"}
		var server, inRedis, scripts, commands []float64
		for _, r := range rep.Runs {
			if r.Redis == s.Name {
				m.Rounds, m.Non2xx = append(m.Rounds, r.RPS), append(m.Non2xx, r.Non2xx)
				server, inRedis = append(server, r.ServerCPU), append(inRedis, r.RedisCPU)
				scripts, commands = append(scripts, r.ScriptTime), append(commands, r.CommandTime)
			}
		}
		m.RPS, m.ServerCPU, m.RedisCPU = medianOf(m.Rounds), medianOf(server), medianOf(inRedis)
		m.ScriptTime, m.CommandTime = medianOf(scripts), medianOf(commands)
		rep.Medians = append(rep.Medians, m)
	}
	rep.Seconds = time.Since(started).Seconds()

	if err := publish(rep, rep.markdown(), cfg.out, cfg.docs, matrixBegin, matrixEnd); err != nil {
		return err
	}
	var bad []string
	for _, r := range rep.Runs {
		if !r.OK {
			bad = append(bad, fmt.Sprintf("round %d, %s: %s", r.Round, r.Redis, r.Problem))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("unexpected answers:\n  %s", strings.Join(bad, "\n  "))
	}
	return nil
}

const (
	matrixBegin = "<!-- servers:begin -->"
	matrixEnd   = "<!-- servers:end -->"
)

func (rep *matrixReport) markdown() string {
	var b strings.Builder
	var names []string
	for _, s := range rep.Servers {
		names = append(names, s.Version)
	}
	fmt.Fprintf(&b, "Measured %s on %s, %d cores shared by the server, Redis and wrk; this library at %s (go-redis %s), %s, %s; "+
		"%s, each a private server with no persistence. Load per Redis server in %d interleaved rounds: `%s` "+
		"(a warm-up, not measured), then `%s`, with [newkey.lua](../bench/sidebyside/newkey.lua) (a new key per "+
		"request). Medians of the rounds; CPU from /proc for the server and from INFO cpu for Redis, command time "+
		"from INFO commandstats:\n\n",
		rep.Date[:10], rep.Machine.CPU, rep.Machine.Cores, rep.Library, rep.GoRedis, rep.Go, rep.Wrk, strings.Join(names, ", "),
		rep.Load.Rounds,
		strings.Replace(rep.Load.Warmup, "-s SCRIPT URL -- ARG", "-s SCRIPT", 1),
		strings.Replace(rep.Load.Measured, "-s SCRIPT URL -- ARG", "-s SCRIPT", 1))
	b.WriteString("| Redis server | first executions/s | server CPU µs/request | Redis CPU µs/request | " +
		"Redis in scripts µs/request | Redis in commands µs/request | req/s per round |\n")
	b.WriteString("| --- | ---: | ---: | ---: | ---: | ---: | --- |\n")
	for i, m := range rep.Medians {
		var rounds []string
		for _, r := range m.Rounds {
			rounds = append(rounds, thousands(r))
		}
		fmt.Fprintf(&b, "| %s | %s | %.0f | %.1f | %.1f | %.1f | %s |\n", rep.Servers[i].Version, thousands(m.RPS),
			m.ServerCPU, m.RedisCPU, m.ScriptTime, m.CommandTime, strings.Join(rounds, ", "))
	}
	b.WriteString("\nRegenerate with `./scripts/bench.sh` (its last step); the JSON is bench/servers.json.\n")
	return b.String()
}
