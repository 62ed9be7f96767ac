// Command sidebyside measures, in one run on one machine, this library in
// key mode, the floor (bench/peers/floor: the fewest Redis commands that
// keep its lock, lease, fence and fingerprint), a middleware of
// github.com/repenguin22/idemlease's design (bench/peers/lease), Fiber v3's
// idempotency middleware with its Redis storage, net/http with no
// middleware and, when -idemlease or IDEMLEASE_DIR names an extracted tree
// of it, idemlease v1.1.0 itself (bench/peers/idemlease, see idemlease.go),
// each a server of its own in front of the same trivial handler and the
// same private redis-server, loaded by wrk on loopback. Rounds interleave
// the servers, so that whatever else the machine does falls on all of them
// alike; the medians of the rounds are compared. It also counts what each
// server asks of Redis per request: round trips (through a counting proxy),
// commands run inside Redis (INFO commandstats, a script's own commands
// included) and, for one request, exactly what was sent (MONITOR).
//
//	go run ./bench/sidebyside -out bench/sidebyside.json -docs docs/benchmarks.md
//	IDEMLEASE_DIR=/tmp/idemlease go run ./bench/sidebyside -out bench/sidebyside.json -docs docs/benchmarks.md
//
// -server names the Redis: redis7 (redis-server from PATH, the default),
// redis8 or valkey8 (Redis 8.0 and Valkey 8.1 from the Debian trixie root
// that scripts/trixie.sh builds). Several, comma-separated, measure this
// library alone on each of them instead, in the same interleaved rounds
// (see matrix.go):
//
//	go run ./bench/sidebyside -server redis7,redis8,valkey8 -out bench/servers.json -docs docs/benchmarks.md
//
// -store postgres measures this library with its keys in PostgreSQL
// (NewSQL) beside idemlease v1.1.0 on its PostgreSQL store, on the
// PostgreSQL that -postgres (by default $POSTGRES_DSN) names, and the
// size of a key's row and the cost of a purge (see postgres.go):
//
//	IDEMLEASE_DIR=/tmp/idemlease go run ./bench/sidebyside -store postgres -docs docs/benchmarks.md
package main

import (
	"context"
	_ "embed"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	docs "github.com/onceonly/idempotency/bench/report"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
)

var (
	//go:embed newkey.lua
	newkeyLua []byte
	//go:embed samekey.lua
	samekeyLua []byte
)

type config struct {
	rounds   int
	duration time.Duration
	warmup   time.Duration
	threads  int
	conns    int
	count    int
	out      string
	docs     string
	readme   string
	timeout  time.Duration
	servers  []redisServer
	// -store postgres
	postgres   string
	sizingRows int
}

func main() {
	// Children are started from this goroutine, pinned to the main thread,
	// so that their parent-death signal fires when the process ends and not
	// when some other thread does.
	runtime.LockOSThread()
	var cfg config
	flag.IntVar(&cfg.rounds, "rounds", 3, "interleaved rounds")
	flag.DurationVar(&cfg.duration, "duration", 6*time.Second, "measured wrk run per server and workload")
	flag.DurationVar(&cfg.warmup, "warmup", 2*time.Second, "unmeasured wrk run before each measured one")
	flag.IntVar(&cfg.threads, "threads", 1, "wrk threads")
	flag.IntVar(&cfg.conns, "conns", 16, "wrk connections")
	flag.IntVar(&cfg.count, "count", 100, "sequential requests per Redis count")
	flag.StringVar(&cfg.out, "out", "bench/sidebyside.json", "write the results as JSON here (bench/servers.json for several -server)")
	flag.StringVar(&cfg.docs, "docs", "", "rewrite this file's section between the side-by-side markers")
	flag.StringVar(&cfg.readme, "readme", "", "rewrite this file's short table between the side-by-side summary markers")
	flag.DurationVar(&cfg.timeout, "timeout", 5*time.Minute, "give up after this long")
	server := flag.String("server", "redis7", "the Redis: redis7, redis8 or valkey8; several, comma-separated, compare them")
	trixie := flag.String("trixie", defaultTrixieBin(), "where scripts/trixie.sh put the redis8 and valkey8 wrappers")
	idemlease := flag.String("idemlease", os.Getenv("IDEMLEASE_DIR"),
		"an extracted github.com/repenguin22/idemlease "+idemleaseVersion+" tree, its redistore in redistore/ "+
			"(its pgstore in pgstore/ for -store postgres): measure it too")
	store := flag.String("store", "redis", "where the keys are: redis, or postgres (see postgres.go)")
	flag.StringVar(&cfg.postgres, "postgres", os.Getenv("POSTGRES_DSN"), "-store postgres: the PostgreSQL URL (loopback)")
	flag.IntVar(&cfg.sizingRows, "sizing-rows", 10_000, "-store postgres: first executions before the table's size is read")
	flag.Parse()
	var err error
	if *store == "postgres" {
		outSet := false
		flag.Visit(func(f *flag.Flag) { outSet = outSet || f.Name == "out" })
		if !outSet {
			cfg.out = "bench/sidebyside-postgres.json"
		}
		if err := postgresMain(cfg, *idemlease); err != nil {
			log.Fatalf("sidebyside: %v", err)
		}
		return
	}
	if *store != "redis" {
		log.Fatalf("sidebyside: -store %q is neither redis nor postgres", *store)
	}
	if cfg.servers, err = redisServers(*server, *trixie); err != nil {
		log.Fatalf("sidebyside: %v", err)
	}
	switch {
	case len(cfg.servers) > 1:
	case *idemlease == "":
		log.Printf("sidebyside: IDEMLEASE_DIR is not set: idemlease is left out (the module proxy does not serve it; docs/benchmarks.md says how to add it)")
	default:
		if kinds, err = withIdemlease(kinds, *idemlease); err != nil {
			log.Fatalf("sidebyside: %v", err)
		}
	}
	outSet := false
	flag.Visit(func(f *flag.Flag) { outSet = outSet || f.Name == "out" })
	if len(cfg.servers) > 1 && !outSet {
		cfg.out = "bench/servers.json"
	}
	runs := len(kinds) * 2
	if len(cfg.servers) > 1 {
		runs = len(cfg.servers)
	}
	if err := cfg.check(runs); err != nil {
		log.Fatalf("sidebyside: %v", err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	if len(cfg.servers) > 1 {
		err = runMatrix(ctx, cfg)
	} else {
		err = runAll(ctx, cfg)
	}
	cancel()
	stop()
	if err != nil {
		log.Fatalf("sidebyside: %v", err)
	}
}

// check refuses flags out of range, and rounds of runs (each server's
// measured runs in one round) that would not end before -timeout.
func (cfg config) check(runs int) error {
	if cfg.rounds < 1 || cfg.rounds > 9 || cfg.duration <= 0 || cfg.duration > time.Minute ||
		cfg.warmup < 0 || cfg.warmup > time.Minute || cfg.threads < 1 || cfg.threads > 16 ||
		cfg.conns < cfg.threads || cfg.conns > 1024 || cfg.count < 1 || cfg.count > 10_000 ||
		cfg.timeout <= 0 || cfg.timeout > 15*time.Minute {
		return fmt.Errorf("a flag is out of range (rounds 1–9, duration and warmup up to 1m, " +
			"threads 1–16, conns threads–1024, count 1–10000, timeout up to 15m)")
	}
	if need := time.Duration(cfg.rounds*runs) * (cfg.duration + cfg.warmup + time.Second); need > cfg.timeout {
		return fmt.Errorf("the runs alone take about %v, more than -timeout %v", need, cfg.timeout)
	}
	return nil
}

func runAll(ctx context.Context, cfg config) (err error) {
	defer func() { err = withCause(ctx, err) }()
	dir, scripts, cleanup, err := prepare(cfg, map[string][]byte{"first": newkeyLua, "duplicates": samekeyLua})
	if err != nil {
		return err
	}
	defer cleanup()

	started := time.Now()
	log.Printf("building the servers")
	builds, err := buildServers(ctx, dir)
	if err != nil {
		return err
	}
	srv, err := redistest.StartProgram(cfg.servers[0].program)
	if err != nil {
		return err
	}
	defer srv.Stop()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	defer rdb.Close()

	rep := newReport(ctx, cfg, rdb, builds)
	lifetime := cfg.timeout + time.Minute

	log.Printf("counting Redis round trips and commands per request")
	if rep.RedisCounts, err = countRedis(ctx, cfg, dir, srv.Addr(), rdb, lifetime); err != nil {
		return err
	}
	log.Printf("throughput: %d rounds × %d servers × 2 workloads", cfg.rounds, len(kinds))
	if rep.Runs, err = throughput(ctx, cfg, dir, srv.Addr(), rdb, scripts, lifetime); err != nil {
		return err
	}
	rep.summarise()
	rep.Seconds = time.Since(started).Seconds()

	if err := publish(rep, rep.markdown(), cfg.out, cfg.docs, beginMarker, endMarker); err != nil {
		return err
	}
	if cfg.readme != "" {
		if err := docs.ReplaceSection(cfg.readme, summaryBegin, summaryEnd, rep.summary()); err != nil {
			return err
		}
		log.Printf("%s updated", cfg.readme)
	}
	if bad := rep.failures(); len(bad) > 0 {
		return fmt.Errorf("unexpected answers:\n  %s", strings.Join(bad, "\n  "))
	}
	return nil
}

// A redisCount is what one server asks of Redis per request in one case.
type redisCount struct {
	Server     string             `json:"server"`
	Case       string             `json:"case"`
	Requests   int                `json:"requests"`
	RoundTrips float64            `json:"round_trips_per_request"`
	Commands   float64            `json:"commands_per_request"`
	ByCommand  map[string]float64 `json:"commands_per_request_by_name"`
	SetupTrips int64              `json:"connection_setup_round_trips"`
	OneRequest [][]string         `json:"one_request_round_trips"`
	OneMonitor []string           `json:"one_request_monitor"`
	Unexpected int                `json:"unexpected_answers"`
	Problems   []string           `json:"problems,omitempty"`
}

var countCases = []struct{ name, what string }{
	{"first", "first execution"},
	{"dup-same", "duplicate, same instance"},
	{"dup-other", "duplicate, second instance"},
}

// countRedis runs, per server, sequential requests of each case through
// instances whose Redis connections pass the round-trip counter.
func countRedis(ctx context.Context, cfg config, dir, redisAddr string, rdb *redis.Client, lifetime time.Duration) ([]redisCount, error) {
	proxy, err := startTripCounter(redisAddr)
	if err != nil {
		return nil, err
	}
	defer proxy.close()
	mon, err := redistest.AttachMonitor(redisAddr)
	if err != nil {
		return nil, err
	}
	defer mon.Close() // MONITOR slows Redis down: off before any throughput run

	var counts []redisCount
	for _, k := range kinds {
		a, err := startInstance(ctx, dir, k, "count-a", proxy.addr(), lifetime)
		if err != nil {
			return nil, err
		}
		var b *instance
		if k.UsesRedis {
			if b, err = startInstance(ctx, dir, k, "count-b", proxy.addr(), lifetime); err != nil {
				a.stop()
				return nil, err
			}
		}
		// Pools connect and scripts load on the first requests: not counted.
		for i := range 3 {
			key := fmt.Sprintf("%s-warm-%d", k.Name, i)
			for _, in := range []*instance{a, a, b} {
				if in != nil {
					post(in.url(), key)
				}
			}
		}
		for _, c := range countCases {
			if c.name == "dup-other" && b == nil {
				continue
			}
			rc, err := countCase(ctx, cfg, k, c.name, a, b, rdb, proxy, mon)
			if err != nil {
				a.stop()
				if b != nil {
					b.stop()
				}
				return nil, err
			}
			counts = append(counts, rc)
			log.Printf("  %-9s %-9s %5.2f round trips, %5.2f commands in Redis per request", k.Name, c.name, rc.RoundTrips, rc.Commands)
		}
		a.stop()
		if b != nil {
			b.stop()
		}
	}
	return counts, nil
}

func countCase(ctx context.Context, cfg config, k kind, name string, a, b *instance, rdb *redis.Client, proxy *tripCounter, mon *redistest.Monitor) (redisCount, error) {
	rc := redisCount{Server: k.Name, Case: name, Requests: cfg.count}
	n := cfg.count + 1 // the last one for MONITOR
	keys := make([]string, n)
	firsts := make([][]byte, n)
	target := a
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-%s-%d", k.Name, name, i)
	}
	if name != "first" {
		for i, key := range keys {
			resp, body, err := post(a.url(), key)
			if err != nil {
				return rc, err
			}
			if resp.StatusCode != 201 {
				rc.problem(fmt.Sprintf("first call of %s answered %d", key, resp.StatusCode))
			}
			firsts[i] = body
		}
		if name == "dup-other" {
			target = b
		}
	}
	request := func(i int) error {
		resp, body, err := post(target.url(), keys[i])
		if err != nil {
			return err
		}
		replay := k.Replay != nil && k.Replay(resp, body, firsts[i])
		switch {
		case resp.StatusCode != 201:
			rc.problem(fmt.Sprintf("%s answered %d", keys[i], resp.StatusCode))
		case name == "first" && resp.Header.Get(k.replayHeader()) != "":
			rc.problem(fmt.Sprintf("%s: a first execution marked a replay", keys[i]))
		case name != "first" && k.Replay != nil && !replay:
			rc.problem(fmt.Sprintf("%s: not a replay of the first answer", keys[i]))
		}
		return nil
	}

	before, err := commandCalls(ctx, rdb)
	if err != nil {
		return rc, err
	}
	trips0, setup0 := proxy.count()
	for i := range cfg.count {
		if err := request(i); err != nil {
			return rc, err
		}
	}
	time.Sleep(50 * time.Millisecond) // anything a server sends after answering
	trips1, setup1 := proxy.count()
	after, err := commandCalls(ctx, rdb)
	if err != nil {
		return rc, err
	}
	delta, total := callsDelta(before, after)
	per := float64(cfg.count)
	rc.RoundTrips = float64(trips1-trips0) / per
	rc.SetupTrips = setup1 - setup0
	rc.Commands = float64(total) / per
	rc.ByCommand = map[string]float64{}
	for name, d := range delta {
		rc.ByCommand[name] = float64(d) / per
	}

	proxy.startLog()
	rc.OneMonitor, err = monitorLines(ctx, mon, rdb, func() error { return request(cfg.count) })
	rc.OneRequest = proxy.stopLog()
	return rc, err
}

func (rc *redisCount) problem(p string) {
	rc.Unexpected++
	if len(rc.Problems) < 5 {
		rc.Problems = append(rc.Problems, p)
	}
}

// A run is one measured wrk run.
type run struct {
	Round    int    `json:"round"`
	Server   string `json:"server"`
	Workload string `json:"workload"`
	Command  string `json:"wrk"`
	wrkResult
	// The server's own counts over the run: answers, 201s, 201 replays,
	// handler executions. They include requests wrk cut off at its end.
	Answers    int64 `json:"server_answers"`
	Created    int64 `json:"server_201"`
	Replayed   int64 `json:"server_201_replays"`
	Executions int64 `json:"server_executions"`
	// CPU per request in microseconds, over the measured run: the
	// server's process, redis-server and wrk; 0 where it could not be read.
	ServerCPU float64 `json:"server_cpu_us_per_request"`
	RedisCPU  float64 `json:"redis_cpu_us_per_request"`
	WrkCPU    float64 `json:"wrk_cpu_us_per_request"`
	// Redis's time in commands per request, in microseconds (INFO
	// commandstats): in scripts, their own commands included, and in every
	// other command.
	ScriptTime  float64 `json:"redis_script_us_per_request"`
	CommandTime float64 `json:"redis_command_us_per_request"`
	// Statements the server sent to PostgreSQL over the run, its own
	// count at the driver (servers on PostgreSQL; RedisCPU is then the
	// CPU of the PostgreSQL backends serving it).
	Statements int64 `json:"server_statements,omitempty"`
	// Gone: answers other than 201 to requests wrk had cut off at its
	// end (the client gone), which no client saw.
	Gone    int64  `json:"server_not_201_client_gone,omitempty"`
	OK      bool   `json:"ok"`
	Problem string `json:"problem,omitempty"`
}

func throughput(ctx context.Context, cfg config, dir, redisAddr string, rdb *redis.Client, scripts map[string]string, lifetime time.Duration) ([]run, error) {
	insts := map[string]*instance{}
	for _, k := range kinds {
		in, err := startInstance(ctx, dir, k, "a", redisAddr, lifetime)
		if err != nil {
			return nil, err
		}
		defer in.stop()
		insts[k.Name] = in
	}
	var runs []run
	for round := 1; round <= cfg.rounds; round++ {
		// Each round starts with another server, so that none always runs
		// first (or last) in a round.
		order := slices.Concat(kinds[(round-1)%len(kinds):], kinds[:(round-1)%len(kinds)])
		for _, k := range order {
			in := insts[k.Name]
			// Every server's runs start on an empty Redis.
			if err := rdb.FlushAll(ctx).Err(); err != nil {
				return nil, err
			}
			for _, workload := range []string{"first", "duplicates"} {
				r, err := measure(ctx, cfg, k, in, redisMeter(rdb), round, workload, scripts[workload])
				if err != nil {
					return nil, err
				}
				runs = append(runs, r)
				log.Printf("  round %d %-9s %-10s %8.0f req/s  p50 %6.3f ms  non-2xx %d  %s",
					round, k.Name, workload, r.RPS, r.P50ms, r.Non2xx, map[bool]string{true: "ok", false: "NOT OK: " + r.Problem}[r.OK])
			}
		}
	}
	return runs, nil
}

func measure(ctx context.Context, cfg config, k kind, in *instance, meter startMeter, round int, workload, script string) (run, error) {
	r := run{Round: round, Server: k.Name, Workload: workload}
	warmArg, arg := fmt.Sprintf("w%d-", round), fmt.Sprintf("m%d-", round)
	if workload == "duplicates" {
		key := fmt.Sprintf("dup-%d", round)
		warmArg, arg = key, key
		resp, _, err := post(in.url(), key)
		if err != nil {
			return r, err
		}
		if resp.StatusCode != 201 {
			r.Problem = fmt.Sprintf("the first call answered %d", resp.StatusCode)
		}
	}
	if cfg.warmup > 0 {
		if _, _, err := runWrk(ctx, wrkArgs(cfg.threads, cfg.conns, cfg.warmup, false, script, in.url(), warmArg), cfg.warmup); err != nil {
			return r, err
		}
	}
	settle := func() { time.Sleep(200 * time.Millisecond) } // requests wrk cut off finish
	settle()
	s0, err := in.stats()
	if err != nil {
		return r, err
	}
	args := wrkArgs(cfg.threads, cfg.conns, cfg.duration, true, script, in.url(), arg)
	// The script is the driver's copy of its file in bench/sidebyside.
	r.Command = "wrk " + strings.Replace(strings.Join(args, " "), filepath.Dir(script), "bench/sidebyside", 1)
	m := meter(ctx, in)
	if r.wrkResult, _, err = runWrk(ctx, args, cfg.duration); err != nil {
		return r, err
	}
	r.ServerCPU, r.RedisCPU = m.cpuPerRequest(ctx, r.Requests)
	r.ScriptTime, r.CommandTime = m.commandTime(ctx, r.Requests)
	if r.Requests > 0 {
		r.WrkCPU = micros(r.CPU) / float64(r.Requests)
	}
	settle()
	s1, err := in.stats()
	if err != nil {
		return r, err
	}
	r.Answers, r.Created = s1.Answers-s0.Answers, s1.Created-s0.Created
	r.Replayed, r.Executions = s1.Replayed-s0.Replayed, s1.Executions-s0.Executions
	r.Statements = s1.Statements - s0.Statements
	r.Gone = s1.Gone - s0.Gone

	var problems []string
	if r.Problem != "" {
		problems = append(problems, r.Problem)
	}
	if r.Non2xx > 0 {
		problems = append(problems, fmt.Sprintf("%d non-2xx answers", r.Non2xx))
	}
	if r.Answers < r.Requests {
		problems = append(problems, fmt.Sprintf("the server counted %d answers, wrk %d", r.Answers, r.Requests))
	}
	switch {
	case r.Created+r.Gone != r.Answers:
		problems = append(problems, fmt.Sprintf("%d of %d answers were not 201", r.Answers-r.Created-r.Gone, r.Answers))
	case workload == "first" && r.Replayed > 0:
		problems = append(problems, fmt.Sprintf("%d first executions were replays", r.Replayed))
	case workload == "duplicates" && k.Replay != nil && (r.Replayed+r.Gone != r.Answers || r.Executions != 0):
		problems = append(problems, fmt.Sprintf("%d of %d answers were 201 replays, %d executions",
			r.Replayed, r.Answers, r.Executions))
	}
	r.OK = len(problems) == 0
	r.Problem = strings.Join(problems, "; ")
	return r, nil
}

const (
	beginMarker = "<!-- sidebyside:begin -->"
	endMarker   = "<!-- sidebyside:end -->"
)

// withCause adds why ctx ended to err, when it did: a run cut short by
// -timeout or a signal says so.
func withCause(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%w (%w)", err, context.Cause(ctx))
	}
	return err
}

// prepare checks for the tools a run needs and writes the wrk scripts
// (workload → source) into a new directory, where the servers are built
// too; it returns each script's path. cleanup stops every process the run
// started and removes the directory.
func prepare(cfg config, sources map[string][]byte) (dir string, scripts map[string]string, cleanup func(), err error) {
	if err := lookTools(cfg); err != nil {
		return "", nil, nil, err
	}
	if dir, err = os.MkdirTemp("", "sidebyside-"); err != nil {
		return "", nil, nil, err
	}
	cleanup = func() {
		stopChildren()
		os.RemoveAll(dir)
	}
	scripts = map[string]string{}
	for workload, source := range sources {
		scripts[workload] = filepath.Join(dir, workload+".lua")
		if err := os.WriteFile(scripts[workload], source, 0o644); err != nil {
			cleanup()
			return "", nil, nil, err
		}
	}
	return dir, scripts, cleanup, nil
}
