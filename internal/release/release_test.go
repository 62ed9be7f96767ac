package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// version is what the test releases a copy of the tree at: not one the
// repository has, so nothing can come from elsewhere.
const version = "v0.9.0"

// consumable are the modules a user fetches, each with the package a
// program imports; every other module of go.work must be named in
// unpublished, so that a new module is one or the other.
var consumable = []struct{ module, pkg string }{
	{"github.com/onceonly/idempotency", "github.com/onceonly/idempotency"},
	{"github.com/onceonly/idempotency/sqlidem", "github.com/onceonly/idempotency/sqlidem"},
	{"github.com/onceonly/idempotency/optimistic", "github.com/onceonly/idempotency/optimistic"},
	{"github.com/onceonly/idempotency/grpcidem", "github.com/onceonly/idempotency/grpcidem"},
	{"github.com/onceonly/idempotency/otelidem", "github.com/onceonly/idempotency/otelidem"},
	{"github.com/onceonly/idempotency/idemtest", "github.com/onceonly/idempotency/idemtest"},
	{"github.com/onceonly/idempotency/sqldialect", "github.com/onceonly/idempotency/sqldialect"},
	{"github.com/onceonly/idempotency/pgnotify", "github.com/onceonly/idempotency/pgnotify"},
	{"github.com/onceonly/idempotency/recipes", "github.com/onceonly/idempotency/recipes/chi"},
}

// installable are the commands a user installs with go install.
var installable = []string{"github.com/onceonly/idempotency/cmd/idemctl"}

// support are modules that no user imports, but that a published module
// needs to build: idemctl reads -db with internal/sqltest/dburl, as the
// example service reads DATABASE_URL. Each must build from its tag.
var support = []string{"internal/sqltest"}

// unpublished are tagged with the rest, but no published module imports
// them outside its tests: the example, tests, benchmarks, and the test
// support other modules' tests use. The test checks that no published
// module's packages import them.
var unpublished = []string{"bench", "e2e", "example", "internal/faultcheck", "internal/release", "internal/sqlstoretest", "internal/stacktest", "sqlidem/internal/servertest"}

// maxRootModules bounds `go list -m all` of a program that requires only
// the root module: itself, the library, and what go-redis, uuid and the
// library's test dependencies bring (the README says so).
const maxRootModules = 14

// TestRelease runs scripts/release.sh on a copy of the tree, publishes
// every module from its tag into a file:// proxy, and then, offline, in a
// new module with no go.work, fetches each module alone with go get and
// builds a program with it. Modules other than ours come from the local
// module cache, read as a second proxy.
func TestRelease(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the release test builds every published module from a file:// proxy")
	}
	for _, tool := range []string{"git", "tar"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found: the release test tags a copy of the tree with it (scripts/test.sh installs it)", tool)
		}
	}
	repo, err := filepath.Abs("../..")
	require.NoError(t, err)
	modcache := strings.TrimSpace(run(t, repo, nil, "go", "env", "GOMODCACHE"))

	// A copy of the tree as it is, committed in a repository of its own.
	src, cleanup, err := checkout(repo, "")
	require.NoError(t, err)
	t.Cleanup(cleanup)
	git := []string{"GIT_AUTHOR_NAME=release test", "GIT_AUTHOR_EMAIL=release@example.com",
		"GIT_COMMITTER_NAME=release test", "GIT_COMMITTER_EMAIL=release@example.com", "GIT_CONFIG_GLOBAL=/dev/null"}
	run(t, src, git, "git", "init", "-q")
	run(t, src, git, "git", "add", "-A")
	run(t, src, git, "git", "commit", "-q", "-m", "the tree")

	// Offline: release.sh reads what it needs from the module cache.
	out := run(t, src, append(git, "GOPROXY=off", "GOTOOLCHAIN=local"), "./scripts/release.sh", version)
	t.Logf("scripts/release.sh %s:\n%s", version, out)

	mods, err := modules(src)
	require.NoError(t, err)
	head := strings.TrimSpace(run(t, src, nil, "git", "rev-parse", "HEAD"))
	var dirs []string
	for _, m := range mods {
		tag := version
		if m.Dir != "." {
			tag = m.Dir + "/" + version
		}
		commit := strings.TrimSpace(run(t, src, nil, "git", "rev-parse", tag+"^{commit}"))
		require.Equal(t, head, commit, "tag %s", tag)
		dirs = append(dirs, m.Dir)
	}
	var covered []string
	for _, c := range consumable {
		covered = append(covered, strings.TrimPrefix(strings.TrimPrefix(c.module, "github.com/onceonly/idempotency"), "/"))
	}
	covered = append(covered, "cmd")
	covered = append(covered, support...)
	covered = append(covered, unpublished...)
	for i, c := range covered {
		if c == "" {
			covered[i] = "."
		}
	}
	require.ElementsMatch(t, dirs, covered, "every module of go.work is fetched here or named in unpublished")

	proxy := t.TempDir()
	_, err = publish(src, version, version, proxy, false)
	require.NoError(t, err)

	// A user's machine: no go.work, our modules from the file:// proxy
	// only, a module cache of its own, no checksum database to ask.
	env := []string{
		"GOWORK=off",
		"GOPROXY=file://" + proxy + ",file://" + filepath.Join(modcache, "cache", "download"),
		"GOSUMDB=off", "GONOSUMDB=", "GOPRIVATE=", "GONOPROXY=", "GOTOOLCHAIN=local",
		"GOMODCACHE=" + t.TempDir(),
		"GOFLAGS=-mod=mod -modcacherw -trimpath",
	}
	for _, c := range consumable {
		dir := t.TempDir()
		run(t, dir, env, "go", "mod", "init", "example.com/consumer")
		run(t, dir, env, "go", "get", c.pkg)
		got := strings.Fields(run(t, dir, env, "go", "list", "-m", c.module))
		require.Equal(t, []string{c.module, version}, got)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"),
			[]byte("package main\n\nimport _ \""+c.pkg+"\"\n\nfunc main() {}\n"), 0o644))
		run(t, dir, env, "go", "build", "-o", os.DevNull, ".")
		if c.module != "github.com/onceonly/idempotency" {
			t.Logf("go get %s alone: %s, and a program built with it", c.pkg, version)
			continue
		}
		all := strings.Split(strings.TrimSpace(run(t, dir, env, "go", "list", "-m", "all")), "\n")
		t.Logf("go get %s alone: %s, and a program built with it; go list -m all: %d modules", c.pkg, version, len(all))
		require.LessOrEqual(t, len(all), maxRootModules, "a program that requires only the root module:\n%s", strings.Join(all, "\n"))
	}
	for _, cmd := range installable {
		bin := t.TempDir()
		run(t, t.TempDir(), append(env, "GOBIN="+bin), "go", "install", cmd+"@"+version)
		_, err := os.Stat(filepath.Join(bin, filepath.Base(cmd)))
		require.NoError(t, err)
		t.Logf("go install %s@%s: built", cmd, version)
	}

	// The released go.mod and go.sum files are complete on their own:
	// each module builds from its tag with nothing added, and its packages
	// (its tests aside) import no module that is not published for them.
	tagged := t.TempDir()
	run(t, src, nil, "sh", "-c", "git archive "+version+" | tar -x -C "+tagged)
	var unimported []string
	for _, dir := range unpublished {
		unimported = append(unimported, "github.com/onceonly/idempotency/"+dir)
	}
	for _, dir := range dirs {
		if slices.Contains(unpublished, dir) {
			continue
		}
		readonly := append(env, "GOFLAGS=-mod=readonly -modcacherw -trimpath", "GOBIN="+t.TempDir())
		run(t, filepath.Join(tagged, dir), readonly, "go", "install", "./...")
		deps := strings.Fields(run(t, filepath.Join(tagged, dir), readonly,
			"go", "list", "-deps", "-f", "{{with .Module}}{{.Path}}{{end}}", "./..."))
		for _, m := range unimported {
			require.NotContains(t, deps, m, "%s imports an unpublished module", dir)
		}
		t.Logf("%s at %s builds with its own go.mod and go.sum (-mod=readonly)", dir, version)
	}
}

// run runs a command in dir with env added to the test's own, and returns
// its standard output; the test fails if it fails.
func run(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "%s %s in %s:\n%s%s", name, strings.Join(args, " "), dir, out, stderr.String())
	return string(out)
}
