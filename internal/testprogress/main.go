// Command testprogress reads `go test -json` on stdin and says what the test
// run is doing as it goes: each package as it starts and as it finishes,
// with its time; the output of every failed test; and, whenever nothing has
// been printed for a while, which packages are still building or running.
// A skipped test's note is printed too, so a skip never goes unexplained.
// With -v it also passes every test's output through, as go test -v does.
// With -recap it prints nothing but the failed tests' output, cut to a
// screenful, for the end of a long log whose reader sees only its tail.
//
// gotestsum formats the same stream well, but prints nothing when a package
// starts and nothing while a package builds or a long test runs; on a cold
// machine a -race build is minutes of silence, which is what this avoids.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// event is one line of `go test -json` (see `go doc test2json`).
type event struct {
	Action     string
	Package    string
	ImportPath string // of build-output and build-fail
	Test       string
	Elapsed    float64
	Output     string
}

func main() {
	verbose := flag.Bool("v", false, "pass every test's output through")
	quiet := flag.Duration("heartbeat", 20*time.Second, "longest silence before saying what still runs")
	recap := flag.Bool("recap", false, "print only the failed tests' output, cut to a screenful")
	flag.Parse()
	if *recap {
		p := newProgress(io.Discard, false)
		p.read(os.Stdin)
		printRecap(os.Stdout, p.failures, recapLines)
		return
	}
	p := newProgress(os.Stdout, *verbose)
	stop := p.heartbeat(*quiet)
	failed := p.read(os.Stdin)
	stop()
	p.summary()
	if failed {
		os.Exit(1)
	}
}

type progress struct {
	mu        sync.Mutex
	out       io.Writer
	verbose   bool
	began     time.Time
	lastLine  time.Time
	running   map[string]time.Time // package → when it started
	output    map[string][]string  // "pkg test" → its output, kept until it passes
	failures  []string             // failed tests' output, repeated at the end
	counts    map[string]int       // pass, fail, skip per test
	pkgs      map[string]int       // pass, fail, skip (no tests) per package
	failedTo  map[string]bool      // packages that failed to build
	announced map[string]bool      // packages whose start was printed
}

func newProgress(out io.Writer, verbose bool) *progress {
	now := time.Now()
	return &progress{
		out: out, verbose: verbose, began: now, lastLine: now,
		running: map[string]time.Time{}, output: map[string][]string{},
		counts: map[string]int{}, pkgs: map[string]int{}, failedTo: map[string]bool{},
		announced: map[string]bool{},
	}
}

func (p *progress) printf(format string, args ...any) {
	fmt.Fprintf(p.out, format, args...)
	p.lastLine = time.Now()
}

// read handles events until stdin ends and reports whether anything
// failed. Lines that are not JSON (go vet's, the go command's own errors)
// are printed as they are.
func (p *progress) read(r io.Reader) (failed bool) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			p.mu.Lock()
			p.printf("%s\n", line)
			p.mu.Unlock()
			continue
		}
		if p.handle(e) {
			failed = true
		}
	}
	return failed
}

func (p *progress) handle(e event) (failed bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	id := e.Package + " " + e.Test
	switch {
	case e.Action == "build-output":
		p.printf("%s", e.Output)
		p.output["build "+e.ImportPath] = append(p.output["build "+e.ImportPath], e.Output)
	case e.Action == "build-fail":
		p.failedTo[e.ImportPath] = true
		p.failures = append(p.failures, strings.Join(p.output["build "+e.ImportPath], ""))
		delete(p.output, "build "+e.ImportPath)
		return true
	case e.Test == "" && e.Action == "start":
		p.running[e.Package] = time.Now()
	case e.Action == "output":
		if !p.announced[e.Package] && !strings.HasPrefix(e.Output, "?") {
			// Announced at its first line, not at "start", so that
			// packages without tests (one "?" line) take one line.
			p.announced[e.Package] = true
			p.printf("▶ %s\n", e.Package)
		}
		if p.verbose {
			p.printf("%s", e.Output)
		}
		p.output[id] = append(p.output[id], e.Output)
	case e.Test != "" && e.Action == "pass":
		p.counts["pass"]++
		delete(p.output, id)
	case e.Test != "" && e.Action == "skip":
		// A skip says why (a database that refused its DSN, a missing
		// binary): that note is printed even without -v.
		p.counts["skip"]++
		if !p.verbose {
			for _, line := range p.output[id] {
				if !strings.HasPrefix(strings.TrimSpace(line), "=== ") {
					p.printf("%s", line)
				}
			}
		}
		delete(p.output, id)
	case e.Test != "" && e.Action == "fail":
		p.counts["fail"]++
		p.failures = append(p.failures, strings.Join(p.output[id], ""))
		if !p.verbose {
			p.printf("%s", strings.Join(p.output[id], ""))
		}
		delete(p.output, id)
		return true
	case e.Test == "" && e.Action == "skip":
		delete(p.running, e.Package)
		p.pkgs["skip"]++
		p.printf("· %s: no tests\n", e.Package)
	case e.Test == "" && (e.Action == "pass" || e.Action == "fail"):
		delete(p.running, e.Package)
		mark := map[string]string{"pass": "✓", "fail": "✗"}[e.Action]
		p.pkgs[e.Action]++
		if e.Action == "fail" {
			// A package can fail outside any test (a panic, TestMain,
			// a timeout): its own output says why, with that of the
			// tests it cut short, which never end with an event.
			var why []string
			for key, lines := range p.output {
				if key != id && strings.HasPrefix(key, e.Package+" ") {
					why = append(why, strings.Join(lines, ""))
					delete(p.output, key)
				}
			}
			slices.Sort(why)
			why = append(why, strings.Join(p.output[id], ""))
			if !p.verbose {
				p.printf("%s", strings.Join(why, ""))
			}
			p.failures = append(p.failures, strings.Join(why, ""))
		}
		delete(p.output, id)
		p.printf("%s %s (%.1fs)\n", mark, e.Package, e.Elapsed)
		return e.Action == "fail"
	}
	return false
}

// heartbeat says what is still going on whenever quiet passes without a
// line; the returned func stops it.
func (p *progress) heartbeat(quiet time.Duration) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// A fine tick, so that a silence ends close to quiet, never
		// much past it (quiet/4 let 25 s pass for a quiet of 20 s).
		tick := time.NewTicker(quiet / 20)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case now := <-tick.C:
				p.mu.Lock()
				if now.Sub(p.lastLine) >= quiet {
					p.printf("… %s\n", p.still(now))
				}
				p.mu.Unlock()
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

func (p *progress) still(now time.Time) string {
	if len(p.running) == 0 {
		return fmt.Sprintf("building test binaries (%s since the start)", now.Sub(p.began).Round(time.Second))
	}
	var names []string
	for pkg, since := range p.running {
		names = append(names, fmt.Sprintf("%s %s", pkg, now.Sub(since).Round(time.Second)))
	}
	slices.Sort(names)
	return "still running: " + strings.Join(names, ", ")
}

func (p *progress) summary() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.failures) > 0 && p.verbose {
		p.printf("\n=== failed tests ===\n%s", strings.Join(p.failures, "\n"))
	}
	var broken []string
	for pkg := range p.failedTo {
		broken = append(broken, pkg)
	}
	slices.Sort(broken)
	for _, pkg := range broken {
		p.printf("✗ %s did not build\n", pkg)
	}
	p.printf("%d packages passed, %d failed, %d without tests; %d tests passed, %d failed, %d skipped, in %s\n",
		p.pkgs["pass"], p.pkgs["fail"], p.pkgs["skip"], p.counts["pass"], p.counts["fail"], p.counts["skip"],
		time.Since(p.began).Round(time.Second))
}

// recapLines is how much of the failures -recap prints: about what a
// reader of a log's tail sees.
const recapLines = 120

// printRecap prints the failed tests' output, each cut to its share of
// limit lines, however long another's output is: its first lines (what
// ran) and its last (a test says what broke as it ends: a failed
// assertion, the fault checker's broken rules).
func printRecap(out io.Writer, failures []string, limit int) {
	var shown []string
	for _, f := range failures {
		if strings.TrimSpace(f) != "" {
			shown = append(shown, f)
		}
	}
	if len(shown) == 0 {
		return
	}
	const least = 8 // lines a failure shows at least
	more := 0
	if most := limit / least; len(shown) > most {
		shown, more = shown[:most], len(shown)-most
	}
	share := max(limit/len(shown), least)
	defer func() {
		if more > 0 {
			fmt.Fprintf(out, "… and %d more failures\n", more)
		}
	}()
	for _, f := range shown {
		lines := strings.SplitAfter(strings.TrimSuffix(f, "\n"), "\n")
		if len(lines) > share {
			head := share / 4
			tail := lines[len(lines)-(share-head):]
			cut := fmt.Sprintf("    … %d lines left out\n", len(lines)-share)
			lines = append(append(lines[:head:head], cut), tail...)
		}
		fmt.Fprint(out, strings.Join(lines, ""))
		if !strings.HasSuffix(lines[len(lines)-1], "\n") {
			fmt.Fprintln(out)
		}
	}
}
