// Command mutants checks that the tests catch what breaks a promise: it
// applies each mutant of its list (list.go), a one-line change that breaks
// one of the middleware's promises, to a copy of the tree, and runs the
// fault checker, aimed at the faults that can reveal it, and the unit tests
// that guard the line. A mutant that neither kills survives, and so does
// one the fault checker misses while the list does not say why no
// interleaving can show it: either makes the command exit 1. The working
// tree is never changed. scripts/mutants.sh runs it:
//
//	scripts/mutants.sh --list                 # the mutants, one a line
//	scripts/mutants.sh                        # every mutant
//	scripts/mutants.sh -n 5 -seed 7           # a random sample of 5
//	scripts/mutants.sh -run 'claim|release'   # the mutants whose names match
//	scripts/mutants.sh -report docs/x.md      # also write the report there
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
)

func main() {
	list := flag.Bool("list", false, "print the mutants, one a line, and exit")
	sample := flag.Int("n", 0, "run a random sample of this many mutants (0: all)")
	seed := flag.Uint64("seed", 0, "seed of the sample and of the fault checker (0: from the clock)")
	run := flag.String("run", "", "run only the mutants whose names match this regular expression")
	checkFor := flag.Duration("duration", 90*time.Second, "how long the fault checker runs histories per mutant, at most")
	race := flag.Bool("race", false, "build with the race detector (slower: fewer histories in the same time)")
	report := flag.String("report", "", "also write the report, in Markdown, to this file")
	flag.Parse()
	if *seed == 0 {
		*seed = uint64(time.Now().UnixNano())
	}
	if *list {
		for _, m := range mutants {
			fmt.Println(m.describe())
		}
		return
	}
	chosen, err := choose(*run, *sample, *seed)
	if err != nil {
		fail(err)
	}
	root, err := repoRoot()
	if err != nil {
		fail(err)
	}
	copyDir, err := os.MkdirTemp("", "mutants-")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(copyDir)
	r := &runner{tree: copyDir, seed: *seed, checkFor: *checkFor, race: *race}
	began, commit := time.Now(), commitOf(root) // the tree as it was copied
	if err := copyTree(root, copyDir); err != nil {
		fail(err)
	}
	fmt.Printf("mutants: %d of %d, seed %d, the fault checker up to %v each, in a copy of the tree at %s\n",
		len(chosen), len(mutants), *seed, *checkFor, copyDir)
	var results []result
	for i, m := range chosen {
		fmt.Printf("[%d/%d] %s (%s): %s\n", i+1, len(chosen), m.name, m.file, m.breaks)
		res := r.try(m)
		fmt.Printf("        %s\n", res.line())
		results = append(results, res)
	}
	text := reportText(results, *seed, time.Since(began), commit)
	fmt.Print("\n" + text)
	if *report != "" {
		if err := os.WriteFile(*report, []byte(text), 0o644); err != nil {
			fail(err)
		}
	}
	if slices.ContainsFunc(results, func(r result) bool { return !r.ok() }) {
		os.Exit(1)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "mutants:", err)
	os.Exit(2)
}

// choose picks the mutants to run: those whose names match pattern, then a
// sample of n of them drawn with seed.
func choose(pattern string, n int, seed uint64) ([]mutant, error) {
	re, err := regexp.Compile(pattern)
	if err != nil {
		return nil, err
	}
	var chosen []mutant
	for _, m := range mutants {
		if re.MatchString(m.name) {
			chosen = append(chosen, m)
		}
	}
	if n > 0 && n < len(chosen) {
		rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
		rng.Shuffle(len(chosen), func(i, j int) { chosen[i], chosen[j] = chosen[j], chosen[i] })
		chosen = chosen[:n]
	}
	if len(chosen) == 0 {
		return nil, fmt.Errorf("no mutant matches %q", pattern)
	}
	return chosen, nil
}

func repoRoot() (string, error) {
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return "", fmt.Errorf("not in a git checkout: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

func commitOf(root string) string {
	out, err := exec.Command("git", "-C", root, "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	commit := strings.TrimSpace(string(out))
	if st, _ := exec.Command("git", "-C", root, "status", "--porcelain", "--untracked-files=no").Output(); len(st) > 0 {
		commit += " with uncommitted changes"
	}
	return commit
}

// copyTree copies the files git knows of (tracked, and untracked but not
// ignored), as they are in the working tree, from root to dst.
func copyTree(root, dst string) error {
	out, err := exec.Command("git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		return fmt.Errorf("listing the tree: %w", err)
	}
	for _, name := range strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00") {
		src := filepath.Join(root, name)
		info, err := os.Lstat(src)
		if errors.Is(err, os.ErrNotExist) {
			continue // deleted in the working tree
		}
		if err != nil || !info.Mode().IsRegular() {
			continue
		}
		to := filepath.Join(dst, name)
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			return err
		}
		b, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		if err := os.WriteFile(to, b, info.Mode().Perm()); err != nil {
			return err
		}
	}
	return nil
}

// runner tries mutants one at a time in one copy of the tree, restoring
// each file after its mutant.
type runner struct {
	tree     string
	seed     uint64
	checkFor time.Duration
	race     bool
}

// result is what one mutant met.
type result struct {
	m        mutant
	err      string   // the mutant could not be applied or built
	rules    []string // the fault checker's rules it broke
	checker  string   // how the fault checker ended otherwise: "" or a failure that names no rule
	tests    []string // the unit tests that failed
	testsErr string   // how the unit tests failed otherwise (a build failure counts as a kill)
	took     time.Duration
}

// killedByChecker reports whether the fault checker failed under the mutant.
func (r result) killedByChecker() bool { return len(r.rules) > 0 || r.checker != "" }

func (r result) killedByTests() bool { return len(r.tests) > 0 || r.testsErr != "" }

// ok reports whether the mutant was killed as the list requires: by the
// fault checker, or by the unit tests when the list says why no
// interleaving can show it.
func (r result) ok() bool {
	if r.err != "" {
		return false
	}
	if r.m.unseen != "" {
		return r.killedByTests()
	}
	return r.killedByChecker()
}

func (r result) line() string {
	if r.err != "" {
		return "NOT RUN: " + r.err
	}
	verdict := "killed"
	if !r.ok() {
		verdict = "SURVIVED"
	}
	return fmt.Sprintf("%s in %v; fault checker: %s; unit tests: %s", verdict, r.took.Round(time.Second),
		r.checkerText(), r.testsText())
}

func (r result) checkerText() string {
	switch {
	case len(r.rules) > 0:
		return "«" + strings.Join(r.rules, "», «") + "»"
	case r.checker != "":
		return r.checker
	case r.m.unseen != "":
		return "not shown (" + r.m.unseen + ")"
	}
	return "survived"
}

func (r result) testsText() string {
	switch {
	case len(r.tests) > 0:
		return strings.Join(r.tests, ", ")
	case r.testsErr != "":
		return r.testsErr
	}
	return "survived"
}

// try applies m, runs the fault checker and the unit tests, and restores
// the file.
func (r *runner) try(m mutant) result {
	began := time.Now()
	res := result{m: m}
	path := filepath.Join(r.tree, m.file)
	original, err := os.ReadFile(path)
	if err != nil {
		res.err = err.Error()
		return res
	}
	mutated, err := m.apply(original)
	if err != nil {
		res.err = err.Error()
		return res
	}
	if err := os.WriteFile(path, mutated, 0o644); err != nil {
		res.err = err.Error()
		return res
	}
	defer os.WriteFile(path, original, 0o644)
	if m.unseen == "" || m.faults != "" || m.steps {
		res.rules, res.checker = r.faultCheck(m)
	}
	res.tests, res.testsErr = r.unitTests(m)
	res.took = time.Since(began)
	return res
}

// faultCheck builds the fault checker (internal/faultcheck) and runs it
// for m, aimed at m's faults, until a rule breaks or its time is up.
func (r *runner) faultCheck(m mutant) (rules []string, other string) {
	bin := filepath.Join(r.tree, "faultcheck.test")
	defer os.Remove(bin)
	build := []string{"test", "-c", "-o", bin}
	if r.race {
		build = append(build, "-race")
	}
	if out, err := r.goCmd(r.tree, 10*time.Minute, append(build, "./internal/faultcheck")...); err != nil {
		return nil, "build failed: " + firstLines(out, 3)
	}
	checkFor := r.checkFor
	args := []string{"-test.run=" + m.checker(), "-test.v", "-test.count=1", "-idem.first",
		fmt.Sprintf("-idem.seed=%d", r.seed), fmt.Sprintf("-idem.duration=%v", checkFor)}
	if m.faults != "" {
		args = append(args, "-idem.faults="+m.faults) // the steps checker's kinds, for a steps mutant
	}
	out, err := r.command(r.tree, checkFor+5*time.Minute, bin, args...)
	rules = brokenRules(out)
	if err != nil && len(rules) == 0 {
		other = "failed: " + firstFailure(out)
	}
	return rules, other
}

// unitTests runs the unit tests that guard m's line, in m's module.
func (r *runner) unitTests(m mutant) (failed []string, other string) {
	dir := filepath.Join(r.tree, m.module)
	args := []string{"test", "-count=1", "-run", m.tests}
	if r.race {
		args = append(args, "-race")
	}
	out, err := r.goCmd(dir, 15*time.Minute, append(args, m.packages()...)...)
	failed = failedTests(out)
	if err != nil && len(failed) == 0 {
		other = "failed: " + firstFailure(out)
	}
	return failed, other
}

func (r *runner) goCmd(dir string, limit time.Duration, args ...string) (string, error) {
	return r.command(dir, limit, "go", args...)
}

// command runs name in dir, bounded by limit, and returns what it printed.
func (r *runner) command(dir string, limit time.Duration, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED="+map[bool]string{true: "1", false: "0"}[r.race])
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 10 * time.Second
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("timed out after %v", limit)
		out.WriteString("\n" + err.Error())
	}
	return out.String(), err
}

var (
	ruleLine = regexp.MustCompile(`RULE BROKEN: (.+?)(?: \(\d+ times?\))?; `)
	failLine = regexp.MustCompile(`^\s*--- FAIL: (\S+)`)
)

// brokenRules lists the rules the fault checker reported broken.
func brokenRules(out string) []string {
	var rules []string
	for _, m := range ruleLine.FindAllStringSubmatch(out, -1) {
		if !slices.Contains(rules, m[1]) {
			rules = append(rules, m[1])
		}
	}
	return rules
}

// failedTests lists the tests that failed, subtests folded into their test.
func failedTests(out string) []string {
	var tests []string
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		m := failLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		name, _, _ := strings.Cut(m[1], "/")
		if !slices.Contains(tests, name) {
			tests = append(tests, name)
		}
	}
	return tests
}

// firstFailure is the first line of out that says what went wrong.
func firstFailure(out string) string {
	for _, line := range strings.Split(out, "\n") {
		l := strings.TrimSpace(line)
		if strings.Contains(l, "panic:") || strings.Contains(l, "Error") || strings.HasPrefix(l, "FAIL") ||
			strings.Contains(l, "timed out") || strings.Contains(l, ".go:") {
			return truncate(l, 160)
		}
	}
	return truncate(firstLines(out, 1), 160)
}

func firstLines(out string, n int) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return strings.Join(lines[:min(n, len(lines))], " / ")
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// reportText is the report in Markdown: a row per mutant.
func reportText(results []result, seed uint64, took time.Duration, commit string) string {
	var b strings.Builder
	killed := 0
	for _, r := range results {
		if r.ok() {
			killed++
		}
	}
	fmt.Fprintf(&b, "Mutants run on %s at commit %s, seed %d, in %v: %d of %d killed as required.\n\n",
		time.Now().UTC().Format("2006-01-02"), commit, seed, took.Round(time.Minute), killed, len(results))
	fmt.Fprintln(&b, "| mutant | file | the promise it breaks | fault checker | unit tests | |")
	fmt.Fprintln(&b, "| --- | --- | --- | --- | --- | --- |")
	for _, r := range results {
		verdict := "killed"
		switch {
		case r.err != "":
			verdict = "not run: " + r.err
		case !r.ok():
			verdict = "**survived**"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", r.m.name, r.m.file, r.m.breaks,
			escape(r.checkerText()), escape(r.testsText()), verdict)
	}
	return b.String()
}

func escape(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
