package idempotency_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Each package of this module compiles only what its users need. The
// dependencies are listed with go list -deps, as a program that imports the
// package would compile them, tests aside.
func TestPackagesCompileOnlyWhatTheyNeed(t *testing.T) {
	// What the protocol runs on: go-redis, uuid and what they bring. Nothing of gRPC, OpenTelemetry or a SQL driver belongs here.
	protocol := []string{
		"github.com/onceonly/idempotency",
		"github.com/onceonly/idempotency/internal/",
		"github.com/redis/go-redis/v9",
		"github.com/google/uuid",
		"github.com/cespare/xxhash/v2",
		"go.uber.org/atomic",
		"golang.org/x/sys/",
	}
	for _, tc := range []struct {
		pkg     string
		allowed []string
	}{
		{".", protocol},
		{"./admin", append([]string{"github.com/onceonly/idempotency/admin"}, protocol...)},
		{"./cloudevents", append([]string{"github.com/onceonly/idempotency/cloudevents"}, protocol...)},
		// The conformance kit adds the assertions of its tests, no store.
		{"./storetest", append([]string{"github.com/onceonly/idempotency/storetest", "github.com/stretchr/testify",
			"github.com/davecgh/go-spew", "github.com/pmezard/go-difflib", "go.yaml.in/yaml/v3"}, protocol...)},
		// The client side needs no Redis, and nothing of the middleware.
		{"./client", []string{"github.com/onceonly/idempotency/client", "github.com/google/uuid"}},
	} {
		t.Run(tc.pkg, func(t *testing.T) {
			deps := nonStandardDeps(t, tc.pkg)
			require.NotEmpty(t, deps)
			for _, dep := range deps {
				require.True(t, slices.ContainsFunc(tc.allowed, func(a string) bool {
					return dep == a || strings.HasPrefix(dep, strings.TrimSuffix(a, "/")+"/")
				}), "%s compiles %s", tc.pkg, dep)
			}
		})
	}
}

// nonStandardDeps lists the packages outside the standard library that pkg
// compiles, itself included.
func nonStandardDeps(t *testing.T, pkg string) []string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH to list dependencies with")
	}
	out, err := exec.Command(goTool, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", pkg).Output()
	require.NoError(t, err)
	return strings.Fields(string(out))
}

// The code map in doc.go names every file of the package, and only files
// that exist, so that a newcomer can trust it.
func TestCodeMapNamesEveryFile(t *testing.T) {
	doc, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	var mapped []string
	for _, m := range regexp.MustCompile(`(?m)^//\t([a-z0-9_]+\.go) `).FindAllStringSubmatch(string(doc), -1) {
		mapped = append(mapped, m[1])
	}
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	var sources []string
	for _, f := range files {
		if !strings.HasSuffix(f, "_test.go") && f != "doc.go" {
			sources = append(sources, f)
		}
	}
	slices.Sort(mapped)
	require.Equal(t, sources, mapped)
}
