package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	docs "github.com/onceonly/idempotency/bench/report"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// report is the JSON the driver writes.
type report struct {
	Date    string  `json:"date"`
	Machine machine `json:"machine"`
	Redis   string  `json:"redis_version"`
	Go      string  `json:"go_version"`
	Wrk     string  `json:"wrk_version"`
	Library string  `json:"library"`
	// Versions are the modules each server was built with.
	Versions map[string]map[string]string `json:"versions"`
	Servers  []kind                       `json:"servers"`
	Load     load                         `json:"load"`
	Runs     []run                        `json:"runs"`
	Medians  []median                     `json:"medians"`
	// RedisCounts is per server and case.
	RedisCounts []redisCount `json:"redis_per_request"`
	Seconds     float64      `json:"seconds"`
}

type machine struct {
	CPU   string `json:"cpu"`
	Cores int    `json:"cores"`
	Note  string `json:"note"`
}

type load struct {
	Measured string `json:"measured"`
	Warmup   string `json:"warmup"`
	Rounds   int    `json:"rounds"`
	Order    string `json:"order"`
	First    string `json:"first_executions"`
	Dups     string `json:"duplicates"`
	Counts   string `json:"redis_counts"`
}

type median struct {
	Server   string    `json:"server"`
	Workload string    `json:"workload"`
	RPS      float64   `json:"rps"`
	Rounds   []float64 `json:"rps_per_round"`
	Non2xx   []int64   `json:"non_2xx_per_round"`
	// VsIdemlease, VsLease, VsFiber and VsBare are this server's median
	// over theirs (VsIdemlease 0 when idemlease was not measured).
	VsIdemlease float64 `json:"vs_idemlease,omitempty"`
	VsLease     float64 `json:"vs_lease"`
	VsFiber     float64 `json:"vs_fiber"`
	VsBare      float64 `json:"vs_bare"`
	// CPU per request in microseconds, medians of the rounds: the
	// server's process, redis-server and wrk.
	ServerCPU float64 `json:"server_cpu_us_per_request"`
	RedisCPU  float64 `json:"redis_cpu_us_per_request"`
	WrkCPU    float64 `json:"wrk_cpu_us_per_request"`
	// Redis's time in commands per request, medians of the rounds.
	ScriptTime  float64 `json:"redis_script_us_per_request"`
	CommandTime float64 `json:"redis_command_us_per_request"`
}

func newReport(ctx context.Context, cfg config, rdb *redis.Client, builds map[string]map[string]string) *report {
	rep := &report{
		Date:     time.Now().UTC().Format(time.RFC3339),
		Machine:  machine{CPU: cpuModel(), Cores: runtime.NumCPU(), Note: "servers, Redis and wrk share the cores"},
		Go:       runtime.Version(),
		Wrk:      wrkVersion(),
		Library:  libraryState(ctx),
		Versions: builds,
		Servers:  kinds,
	}
	rep.Redis, _ = redistest.Version(ctx, rdb)
	rep.Load = load{
		Measured: "wrk " + strings.Join(wrkArgs(cfg.threads, cfg.conns, cfg.duration, true, "SCRIPT", "URL", "ARG"), " "),
		Warmup:   "wrk " + strings.Join(wrkArgs(cfg.threads, cfg.conns, cfg.warmup, false, "SCRIPT", "URL", "ARG"), " "),
		Rounds:   cfg.rounds,
		Order:    "round r starts with server r (" + kindNames() + "), each server's two workloads back to back on an emptied Redis",
		First:    "bench/sidebyside/newkey.lua: POST /payments, a new Idempotency-Key per request (ARG: a prefix per round)",
		Dups:     "bench/sidebyside/samekey.lua: POST /payments, every connection repeating one key (ARG) after one first call",
		Counts: fmt.Sprintf("%d sequential requests per case through a counting proxy (round trips) with INFO commandstats "+
			"before and after (commands run in Redis, a script's own included); one more under MONITOR", cfg.count),
	}
	return rep
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

// libraryState names the library's commit and whether its own files (not
// its tests) differ from it: the library is measured as it is on disk.
func libraryState(ctx context.Context) string {
	rev, err := exec.CommandContext(ctx, "git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown (no git)"
	}
	state := "commit " + strings.TrimSpace(string(rev))
	top, _ := exec.CommandContext(ctx, "git", "rev-parse", "--show-toplevel").Output()
	status, _ := exec.CommandContext(ctx, "git", "-C", strings.TrimSpace(string(top)), "status", "--porcelain", "--",
		":(glob)*.go", ":(glob)lua/**", ":(glob)internal/**", "go.mod", "go.sum").Output()
	changed := 0
	for line := range strings.SplitSeq(strings.TrimSpace(string(status)), "\n") {
		if line != "" && !strings.HasSuffix(line, "_test.go") {
			changed++
		}
	}
	if changed > 0 {
		state += fmt.Sprintf(" with %d of its files changed in the working tree", changed)
	}
	return state
}

// summarise computes the medians and ratios.
func (rep *report) summarise() {
	byKey := map[string]*median{}
	for _, w := range []string{"first", "duplicates"} {
		for _, k := range kinds {
			m := &median{Server: k.Name, Workload: w}
			var server, inRedis, wrk, scripts, commands []float64
			for _, r := range rep.Runs {
				if r.Server == k.Name && r.Workload == w {
					m.Rounds = append(m.Rounds, r.RPS)
					m.Non2xx = append(m.Non2xx, r.Non2xx)
					server, inRedis, wrk = append(server, r.ServerCPU), append(inRedis, r.RedisCPU), append(wrk, r.WrkCPU)
					scripts, commands = append(scripts, r.ScriptTime), append(commands, r.CommandTime)
				}
			}
			m.RPS = medianOf(m.Rounds)
			m.ServerCPU, m.RedisCPU, m.WrkCPU = medianOf(server), medianOf(inRedis), medianOf(wrk)
			m.ScriptTime, m.CommandTime = medianOf(scripts), medianOf(commands)
			byKey[k.Name+"/"+w] = m
			rep.Medians = append(rep.Medians, *m)
		}
	}
	for i := range rep.Medians {
		m := &rep.Medians[i]
		if il, ok := byKey["idemlease/"+m.Workload]; ok && il.RPS > 0 {
			m.VsIdemlease = m.RPS / il.RPS
		}
		if l := byKey["lease/"+m.Workload].RPS; l > 0 {
			m.VsLease = m.RPS / l
		}
		if f := byKey["fiber/"+m.Workload].RPS; f > 0 {
			m.VsFiber = m.RPS / f
		}
		if b := byKey["bare/"+m.Workload].RPS; b > 0 {
			m.VsBare = m.RPS / b
		}
	}
}

func medianOf(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func (rep *report) median(server, workload string) median {
	for _, m := range rep.Medians {
		if m.Server == server && m.Workload == workload {
			return m
		}
	}
	return median{}
}

// failures lists the runs and counts whose answers were not what they
// should be.
func (rep *report) failures() []string {
	var bad []string
	for _, r := range rep.Runs {
		if !r.OK {
			bad = append(bad, fmt.Sprintf("round %d, %s, %s: %s", r.Round, r.Server, r.Workload, r.Problem))
		}
	}
	for _, c := range rep.RedisCounts {
		if c.Unexpected > 0 {
			bad = append(bad, fmt.Sprintf("Redis count, %s, %s: %d unexpected answers: %s",
				c.Server, c.Case, c.Unexpected, strings.Join(c.Problems, "; ")))
		}
	}
	return bad
}

var shortWorkloadTitles = map[string]string{"first": "first executions", "duplicates": "duplicates"}

var workloadTitles = map[string]string{
	"first":      "first executions (a new key per request)",
	"duplicates": "duplicates (16 connections repeating one key)",
}

// markdown is the section for docs/benchmarks.md.
func (rep *report) markdown() string {
	var b strings.Builder
	title := map[string]string{}
	for _, k := range kinds {
		title[k.Name] = k.Title
	}
	fiber := rep.Versions["fiber"]
	idemlease := ""
	if il, ok := rep.Versions["idemlease"]; ok {
		idemlease = fmt.Sprintf("; idemlease %s with redistore %s (go-redis %s), built from an extracted tree of that release",
			il["github.com/repenguin22/idemlease"], il["github.com/repenguin22/idemlease/redistore"], il["github.com/redis/go-redis/v9"])
	}
	fmt.Fprintf(&b, "Measured %s on %s, %d cores shared by the servers, Redis and wrk; %s, %s, %s. "+
		"Fiber %s with storage/redis/v3 %s (go-redis %s, fasthttp %s); this library at %s (go-redis %s)%s.\n\n",
		rep.Date[:10], rep.Machine.CPU, rep.Machine.Cores, rep.Redis, rep.Go, rep.Wrk,
		fiber["github.com/gofiber/fiber/v3"], fiber["github.com/gofiber/storage/redis/v3"],
		fiber["github.com/redis/go-redis/v9"], fiber["github.com/valyala/fasthttp"],
		rep.Library, rep.Versions["ours"]["github.com/redis/go-redis/v9"], idemlease)
	fmt.Fprintf(&b, "Load, per server and workload, in %d interleaved rounds: `%s` (a warm-up, not "+
		"measured), then `%s`, against `http://127.0.0.1:PORT/payments`. First executions run "+
		"[newkey.lua](../bench/sidebyside/newkey.lua) (a new key per request; the argument after `--` is "+
		"the keys' prefix, `wR-` for the warm-up and `mR-` for the measured run of round R), duplicates "+
		"[samekey.lua](../bench/sidebyside/samekey.lua) with `-- dup-R` (every connection repeats that key, "+
		"after one first call with it). req/s is the median of the rounds.\n\n",
		rep.Load.Rounds,
		strings.Replace(rep.Load.Warmup, "-s SCRIPT URL -- ARG", "-s SCRIPT", 1),
		strings.Replace(rep.Load.Measured, "-s SCRIPT URL -- ARG", "-s SCRIPT", 1))

	// A column per server, then each middleware of ours over each peer,
	// and this library over net/http.
	var ratios []kind
	for _, k := range kinds {
		if k.Name == "ours" || k.Name == "floor" {
			ratios = append(ratios, k)
		}
	}
	peers := ratioPeers()
	b.WriteString("| workload |" + kindColumns() + "")
	for _, k := range ratios {
		for _, p := range peers {
			b.WriteString(" " + k.Title + " / " + p.title + " |")
		}
	}
	b.WriteString(" this library / net/http |\n| --- |" + strings.Repeat(" ---: |", len(kinds)+len(ratios)*len(peers)+1) + "\n")
	for _, w := range []string{"first", "duplicates"} {
		fmt.Fprintf(&b, "| %s |", workloadTitles[w])
		for _, k := range kinds {
			fmt.Fprintf(&b, " %s |", thousands(rep.median(k.Name, w).RPS))
		}
		for _, k := range ratios {
			for _, p := range peers {
				fmt.Fprintf(&b, " %.2f |", p.of(rep.median(k.Name, w)))
			}
		}
		fmt.Fprintf(&b, " %.2f |\n", rep.median("ours", w).VsBare)
	}

	b.WriteString("\nCPU time per request in microseconds, median of the rounds: the server's process (every " +
		"thread, from /proc), redis-server (INFO cpu) and wrk. The three share the cores, so what a server " +
		"asks of Redis slows it as much as its own work does:\n\n")
	rep.perRequestTable(&b, []perRequestRow{
		{"server process", func(m median) float64 { return m.ServerCPU }, false},
		{"Redis", func(m median) float64 { return m.RedisCPU }, true},
		{"server and Redis", func(m median) float64 { return m.ServerCPU + m.RedisCPU }, false},
		{"wrk", func(m median) float64 { return m.WrkCPU }, false},
	})
	b.WriteString("\nRedis's time per request in microseconds by its own clock (INFO commandstats), median of the " +
		"rounds: in scripts, the commands they run included, and in commands, whether a script or the client " +
		"sent them (so the two overlap). A busy machine's waits for a core are in it too, so it can exceed " +
		"Redis's CPU time above:\n\n")
	rep.perRequestTable(&b, []perRequestRow{
		{"in scripts", func(m median) float64 { return m.ScriptTime }, true},
		{"in commands", func(m median) float64 { return m.CommandTime }, true},
	})

	rep.ladderSection(&b)

	b.WriteString("\nEvery run: req/s, p50 latency, non-2xx answers (wrk's count), and whether every answer was as it " +
		"should be (the server's own count: 201s for first executions; for duplicates behind a middleware, " +
		"201 replays with no execution of the handler):\n\n")
	b.WriteString("| round | workload |" + kindColumns() + "\n| ---: | --- |" + strings.Repeat(" --- |", len(kinds)) + "\n")
	for round := 1; round <= rep.Load.Rounds; round++ {
		for _, w := range []string{"first", "duplicates"} {
			fmt.Fprintf(&b, "| %d | %s |", round, w)
			for _, k := range kinds {
				for _, r := range rep.Runs {
					if r.Round == round && r.Server == k.Name && r.Workload == w {
						check := "all 201"
						if w == "duplicates" && k.Replay != nil {
							check = "all 201 replays"
						}
						if !r.OK {
							check = "**" + r.Problem + "**"
						}
						fmt.Fprintf(&b, " %s, %.2f ms, %d non-2xx, %s |", thousands(r.RPS), r.P50ms, r.Non2xx, check)
					}
				}
			}
			b.WriteString("\n")
		}
	}

	b.WriteString("\nRedis per request: round trips (counted on the wire, so a pipeline is one) / commands run " +
		"in Redis (INFO commandstats, a script's own commands included), over ")
	requests := 0
	if len(rep.RedisCounts) > 0 {
		requests = rep.RedisCounts[0].Requests
	}
	fmt.Fprintf(&b, "%d sequential requests per case:\n\n", requests)
	b.WriteString("| request |" + kindColumns() + "\n| --- |" + strings.Repeat(" --- |", len(kinds)) + "\n")
	for _, c := range countCases {
		fmt.Fprintf(&b, "| %s |", c.what)
		for _, k := range kinds {
			rc, ok := rep.count(k.Name, c.name)
			if !ok {
				b.WriteString(" — |")
				continue
			}
			fmt.Fprintf(&b, " %s / %s |", trim(rc.RoundTrips), trim(rc.Commands))
		}
		b.WriteString("\n")
	}

	b.WriteString("\nWhat one request sends, round trip by round trip (commands that a script runs inside Redis, " +
		"from MONITOR, in brackets):\n\n")
	for _, k := range kinds {
		if !k.UsesRedis {
			continue
		}
		for _, c := range countCases {
			rc, ok := rep.count(k.Name, c.name)
			if !ok {
				continue
			}
			fmt.Fprintf(&b, "- %s, %s: %s\n", k.Title, c.what, sentSummary(rc))
		}
	}
	if hasKind("idemlease") {
		b.WriteString("\nidemlease is the library itself, with its Redis store, as its README wires it; the " +
			"lease-in-record server is the same design written from its documentation. ")
	} else {
		b.WriteString("\n")
	}
	b.WriteString("The lease-in-record server has no lock apart from its record: a hash holding a lease " +
		"token, claimed by one script and completed by another; it renews no lease and fences no " +
		"executor. ")
	b.WriteString("Fiber's lock is its default, in the " +
		"memory of one process: two instances do not exclude each other. This library's lock is in Redis, " +
		"shared by every instance, and so is the floor's, which has no in-process cache: its duplicates " +
		"read Redis every time. Regenerate with `./scripts/bench.sh`; the JSON is bench/sidebyside.json.\n")
	return b.String()
}

// A perRequestRow is one row of a per-request table: what it shows, read
// from a median, and whether it is about Redis (none for net/http alone).
type perRequestRow struct {
	what  string
	of    func(median) float64
	redis bool
}

// A ratioPeer is a server the middlewares of ours are compared with.
type ratioPeer struct {
	title string
	of    func(median) float64
}

// ratioPeers are idemlease (when measured), the lease in record and Fiber.
func ratioPeers() []ratioPeer {
	var peers []ratioPeer
	if hasKind("idemlease") {
		peers = append(peers, ratioPeer{"idemlease", func(m median) float64 { return m.VsIdemlease }})
	}
	return append(peers,
		ratioPeer{"lease in record", func(m median) float64 { return m.VsLease }},
		ratioPeer{"Fiber", func(m median) float64 { return m.VsFiber }})
}

func hasKind(name string) bool {
	return slices.ContainsFunc(kinds, func(k kind) bool { return k.Name == name })
}

// kindNames is the servers' names, comma-separated, in kinds' order.
func kindNames() string {
	var names []string
	for _, k := range kinds {
		names = append(names, k.Name)
	}
	return strings.Join(names, ", ")
}

// kindColumns is a table header's column per server, in kinds' order.
func kindColumns() string {
	var b strings.Builder
	for _, k := range kinds {
		b.WriteString(" " + k.Title + " |")
	}
	return b.String()
}

// perRequestTable writes rows for each workload, a column per server.
func (rep *report) perRequestTable(b *strings.Builder, rows []perRequestRow) {
	b.WriteString("| workload | of |" + kindColumns() + "\n| --- | --- |" + strings.Repeat(" ---: |", len(kinds)) + "\n")
	for _, w := range []string{"first", "duplicates"} {
		for _, row := range rows {
			fmt.Fprintf(b, "| %s | %s |", shortWorkloadTitles[w], row.what)
			for _, k := range kinds {
				if row.redis && !k.UsesRedis {
					b.WriteString(" — |")
					continue
				}
				fmt.Fprintf(b, " %.0f |", row.of(rep.median(k.Name, w)))
			}
			b.WriteString("\n")
		}
	}
}

func (rep *report) count(server, c string) (redisCount, bool) {
	for _, rc := range rep.RedisCounts {
		if rc.Server == server && rc.Case == c {
			return rc, true
		}
	}
	return redisCount{}, false
}

// sentSummary is `evalsha + evalsha [get, set] ; evalsha [...]`: the
// command names of each round trip, the script commands MONITOR showed
// after each client command.
func sentSummary(rc redisCount) string {
	if len(rc.OneRequest) == 0 {
		return "no round trip"
	}
	// MONITOR lists a client's command, then the commands its script ran.
	var inner [][]string
	for _, line := range rc.OneMonitor {
		if s, ok := strings.CutPrefix(line, "  lua: "); ok {
			if len(inner) > 0 {
				name, _, _ := strings.Cut(s, " ")
				inner[len(inner)-1] = append(inner[len(inner)-1], name)
			}
			continue
		}
		inner = append(inner, []string{})
	}
	var trips []string
	i := 0
	for _, trip := range rc.OneRequest {
		var cmds []string
		for _, c := range trip {
			name, _, _ := strings.Cut(c, " ")
			s := "`" + name + "`"
			if i < len(inner) && len(inner[i]) > 0 {
				s += " [" + strings.Join(inner[i], ", ") + "]"
			}
			i++
			cmds = append(cmds, s)
		}
		trips = append(trips, strings.Join(cmds, " + "))
	}
	plural := "s"
	if len(rc.OneRequest) == 1 {
		plural = ""
	}
	return fmt.Sprintf("%d round trip%s: ", len(rc.OneRequest), plural) + strings.Join(trips, "; then ")
}

// trim is f with at most two decimals and no trailing zeros.
func trim(f float64) string {
	s := strconv.FormatFloat(f, 'f', 2, 64)
	s = strings.TrimRight(s, "0")
	return strings.TrimSuffix(s, ".")
}

func thousands(f float64) string {
	s := strconv.FormatInt(int64(f+0.5), 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// publish writes a run's report: rep as JSON to out, md to the terminal,
// and md between begin and end in the docs file, when one is named.
func publish(rep any, md, out, docsFile, begin, end string) error {
	data, _ := json.MarshalIndent(rep, "", "  ")
	if err := os.WriteFile(out, append(data, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Print("\n" + md)
	if docsFile == "" {
		return nil
	}
	if err := docs.ReplaceSection(docsFile, begin, end, md); err != nil {
		return err
	}
	log.Printf("%s updated", docsFile)
	return nil
}
