package main

import (
	"encoding/json"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// documented are the sets of packages the README and docs show a program
// importing together, each built in a module of its own from the quick
// start's lines.
var documented = [][]string{
	{"github.com/onceonly/idempotency", "github.com/onceonly/idempotency/idemtest"},
	{"github.com/onceonly/idempotency", "github.com/onceonly/idempotency/sqlidem"},
	{"github.com/onceonly/idempotency", "github.com/onceonly/idempotency/optimistic"},
	{"github.com/onceonly/idempotency", "github.com/onceonly/idempotency/grpcidem"},
	{"github.com/onceonly/idempotency", "github.com/onceonly/idempotency/otelidem"},
	{"github.com/onceonly/idempotency", "github.com/onceonly/idempotency/recipes/chi"},
}

// TestQuickStartLinesAsPasted runs the README's quick start lines, as
// pasted, in a new module beside the repository (as ../idempotency), and
// builds a program with each documented set of packages; offline, with
// every other module from the module cache, as a second machine's proxy
// would serve them. A module the lines leave out is not found there (on
// a user's machine: 403 Forbidden from the module proxy).
//
// The module cache must hold what tidy reads (scripts/test.sh --setup
// fetches it): a module missing from it reads "no such file or directory"
// under file://…/cache/download.
func TestQuickStartLinesAsPasted(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the quick start test tidies and builds a module per documented set of packages")
	}
	repo, err := filepath.Abs("../..")
	require.NoError(t, err)
	readme, err := os.ReadFile(filepath.Join(repo, "README.md"))
	require.NoError(t, err)
	lines := quickStartLines(t, string(readme))
	modcache := strings.TrimSpace(run(t, repo, nil, "go", "env", "GOMODCACHE"))
	env := []string{
		"GOWORK=off",
		"GOPROXY=file://" + filepath.Join(modcache, "cache", "download"),
		"GOSUMDB=off", "GONOSUMDB=", "GOPRIVATE=", "GONOPROXY=", "GOTOOLCHAIN=local",
		"GOFLAGS=-mod=mod -modcacherw",
	}
	for _, pkgs := range documented {
		t.Run(filepath.Base(pkgs[len(pkgs)-1]), func(t *testing.T) {
			home := t.TempDir()
			require.NoError(t, os.Symlink(repo, filepath.Join(home, "idempotency")))
			app := filepath.Join(home, "app")
			require.NoError(t, os.Mkdir(app, 0o755))
			run(t, app, env, "go", "mod", "init", "example.com/app")
			src := "package main\n\nimport (\n"
			for _, p := range pkgs {
				src += "\t_ \"" + p + "\"\n"
			}
			src += ")\n\nfunc main() {}\n"
			require.NoError(t, os.WriteFile(filepath.Join(app, "main.go"), []byte(src), 0o644))
			run(t, app, env, "sh", "-e", "-c", lines)
			replaced := replacements(t, app, env)
			modules := slices.Clone(support) // what tests of the published modules import
			for _, c := range consumable {
				modules = append(modules, strings.TrimPrefix(strings.TrimPrefix(c.module, "github.com/onceonly/idempotency"), "/"))
			}
			for _, dir := range modules {
				// Every module, also one this program does not use: the
				// next one it imports must not fail.
				module, want := path.Join("github.com/onceonly/idempotency", dir), path.Join("../idempotency", dir)
				require.Contains(t, replaced, module+" => "+want, "the quick start's lines point Go at %s", module)
			}
			run(t, app, env, "go", "build", "-o", os.DevNull, ".")
			run(t, app, env, "go", "vet", ".")
		})
	}
}

// quickStartLines are the lines of the README's quick start that point Go
// at the clone: its sh block that runs go mod edit.
func quickStartLines(t *testing.T, readme string) string {
	t.Helper()
	start := strings.Index(readme, "\n## Quick start\n")
	require.GreaterOrEqual(t, start, 0, "the README has a quick start")
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(readme[start:], -1) {
		if strings.Contains(m[1], "go mod edit") {
			return m[1]
		}
	}
	t.Fatal("the README's quick start has no sh block that runs go mod edit")
	return ""
}

// replacements lists the replacements of the go.mod in dir, one
// "old => new" a line.
func replacements(t *testing.T, dir string, env []string) string {
	t.Helper()
	var mod struct {
		Replace []struct{ Old, New struct{ Path string } }
	}
	require.NoError(t, json.Unmarshal([]byte(run(t, dir, env, "go", "mod", "edit", "-json")), &mod))
	var out strings.Builder
	for _, r := range mod.Replace {
		out.WriteString(r.Old.Path + " => " + r.New.Path + "\n")
	}
	return out.String()
}
