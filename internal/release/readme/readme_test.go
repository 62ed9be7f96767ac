// Package readme tests the README's Go snippets: each one, pasted into a
// function, must compile and pass go vet. A reader who copies one gets
// working code, errors included.
package readme

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/mod/modfile"
)

// environment declares what a snippet may use without declaring it: what
// the reader has at hand where the snippet goes (a Redis client, the
// request being served, the handlers of their own application). A name
// with two declarations is tried with each, in order.
var environment = map[string][]string{
	"rdb":           {"var rdb redis.UniversalClient"},
	"idem":          {"var idem *idempotency.Middleware"},
	"r":             {"var r chi.Router", "var r *http.Request"},
	"w":             {"var w http.ResponseWriter"},
	"mux":           {"var mux *http.ServeMux"},
	"ctx":           {"var ctx context.Context"},
	"db":            {"var db *sql.DB"},
	"tmpl":          {"var tmpl *template.Template"},
	"msg":           {"var msg struct {\n\tID   string\n\tData []byte\n}"},
	"Receipt":       {"type Receipt struct{ ID string }"},
	"clientID":      {"func clientID(*http.Request) (string, error) { return \"\", nil }"},
	"charge":        {"func charge(context.Context, []byte) (Receipt, error) { return Receipt{}, nil }"},
	"ack":           {"func ack(Receipt) {}"},
	"transfer":      {"func transfer(*sql.Tx, http.ResponseWriter, *http.Request) error { return nil }"},
	"createOrder":   {"func createOrder(http.ResponseWriter, *http.Request) {}"},
	"createPayment": {"func createPayment(http.ResponseWriter, *http.Request) {}"},
	"createCharge":  {"func createCharge(http.ResponseWriter, *http.Request) {}"},
	"handleGitHub":  {"func handleGitHub(http.ResponseWriter, *http.Request) {}"},
}

// knownPackages are the packages a snippet may name that are not this
// repository's; the repository's own are found in the tree, so that a
// package that moves is found where it went.
var knownPackages = map[string]string{
	"context":  "context",
	"errors":   "errors",
	"fmt":      "fmt",
	"http":     "net/http",
	"json":     "encoding/json",
	"log":      "log",
	"slog":     "log/slog",
	"sql":      "database/sql",
	"template": "html/template",
	"time":     "time",
	"chi":      "github.com/go-chi/chi/v5",
	"redis":    "github.com/redis/go-redis/v9",
}

// A snippet is one ```go block of the README.
type snippet struct {
	line    int    // the README line of its first line of code
	code    string // as the README has it
	free    []string
	choice  []int // per free name, which of its declarations
	genLine int   // the generated file's line of the snippet's first line
}

func TestREADMESnippets(t *testing.T) {
	repo, err := filepath.Abs("../../..")
	require.NoError(t, err)
	readme, err := os.ReadFile(filepath.Join(repo, "README.md"))
	require.NoError(t, err)
	snippets := extract(string(readme))
	require.NotEmpty(t, snippets, "README.md has no ```go block")

	packages := repositoryPackages(t, repo)
	for name, path := range knownPackages {
		packages[name] = path
	}

	// A workspace of the repository's modules and one more for the snippets.
	dir := t.TempDir()
	work := workspace(t, repo)
	require.NoError(t, work.AddUse("./snippets", ""))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.work"), modfile.Format(work.Syntax), 0o644))
	// The workspace's checksums too: without them the go command would ask
	// the checksum database for go.mod files of versions nothing builds
	// with (go-redis's own x/sys), which offline it cannot.
	sums, err := os.ReadFile(filepath.Join(repo, "go.work.sum"))
	if err != nil && !os.IsNotExist(err) {
		require.NoError(t, err)
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.work.sum"), sums, 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "snippets"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "snippets", "go.mod"),
		[]byte("module snippets\n\ngo "+work.Go.Version+"\n"), 0o644))

	for i := range snippets {
		s := &snippets[i]
		s.free = freeNames(t, s, packages)
		s.choice = make([]int, len(s.free))
		for _, name := range s.free {
			if _, ok := environment[name]; !ok && packages[name] == "" {
				t.Errorf("README.md:%d: the snippet uses %s, which it does not declare: declare it there, "+
					"or add what a reader would have to the test's environment", s.line, name)
			}
		}
	}
	if t.Failed() {
		return
	}

	// Each round vets every snippet still failing; one that fails with a
	// name that has another declaration to try is tried again with it.
	pending := make([]int, len(snippets))
	for i := range pending {
		pending[i] = i
	}
	for round := 0; len(pending) > 0; round++ {
		for _, i := range pending {
			src := generate(&snippets[i], packages)
			pkg := filepath.Join(dir, "snippets", fmt.Sprintf("s%d", i))
			require.NoError(t, os.MkdirAll(pkg, 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(pkg, "snippet.go"), src, 0o644))
		}
		failures := vet(t, dir, pending)
		var next []int
		for _, i := range pending {
			out, failed := failures[i]
			if !failed {
				continue
			}
			if advance(&snippets[i]) {
				next = append(next, i)
				continue
			}
			t.Errorf("README.md:%d: the snippet does not compile, or go vet finds fault with it:\n%s\n%s",
				snippets[i].line, snippets[i].code, readmeLines(&snippets[i], out))
		}
		pending = next
	}
}

var fence = regexp.MustCompile("(?m)^```go\n((?s:.*?))^```")

func extract(readme string) []snippet {
	var out []snippet
	for _, m := range fence.FindAllStringSubmatchIndex(readme, -1) {
		code := readme[m[2]:m[3]]
		out = append(out, snippet{line: strings.Count(readme[:m[2]], "\n") + 1, code: code})
	}
	return out
}

// repositoryPackages maps the name of every package of the repository a
// user may import to its path.
func repositoryPackages(t *testing.T, repo string) map[string]string {
	var patterns []string
	for _, use := range workspace(t, repo).Use {
		patterns = append(patterns, filepath.Join(use.Path, "...")) // absolute
	}
	cmd := exec.Command("go", append([]string{"list", "-e", "-f", "{{.Name}} {{.ImportPath}}"}, patterns...)...)
	cmd.Dir = repo
	out, err := cmd.Output()
	require.NoError(t, err, "go list")
	packages := map[string]string{}
	for line := range strings.Lines(string(out)) {
		name, path, _ := strings.Cut(strings.TrimSpace(line), " ")
		// Commands, internals, and the examples of how to mount the
		// middleware on a framework (whose packages take the framework's
		// name) are nothing a snippet imports.
		if name == "main" || strings.Contains(path, "/internal/") || strings.Contains(path, "/recipes/") || packages[name] != "" {
			continue
		}
		packages[name] = path
	}
	return packages
}

// workspace is the repository's go.work with every directory made absolute.
func workspace(t *testing.T, repo string) *modfile.WorkFile {
	data, err := os.ReadFile(filepath.Join(repo, "go.work"))
	require.NoError(t, err)
	work, err := modfile.ParseWork("go.work", data, nil)
	require.NoError(t, err)
	abs := func(p string) string {
		if modfile.IsDirectoryPath(p) && !filepath.IsAbs(p) {
			return filepath.Join(repo, p)
		}
		return p
	}
	out := &modfile.WorkFile{Syntax: new(modfile.FileSyntax)}
	require.NoError(t, out.AddGoStmt(work.Go.Version))
	for _, use := range work.Use {
		require.NoError(t, out.AddUse(abs(use.Path), ""))
	}
	for _, r := range work.Replace {
		require.NoError(t, out.AddReplace(r.Old.Path, r.Old.Version, abs(r.New.Path), r.New.Version))
	}
	return out
}

// freeNames lists the names the snippet uses without declaring them,
// other than Go's own (a package name counts as free).
func freeNames(t *testing.T, s *snippet, packages map[string]string) []string {
	f, err := parser.ParseFile(token.NewFileSet(), "snippet.go", "package p\nfunc _() {\n"+s.code+"}\n", 0)
	require.NoError(t, err, "README.md:%d: the snippet does not parse as the body of a function", s.line)
	var free []string
	for name := range freeIn(f.Decls[0].(*ast.FuncDecl).Body, nil) {
		if name != "_" && !universe[name] {
			free = append(free, name)
		}
	}
	// Packages first: they are never tried with another declaration.
	sort.Slice(free, func(i, j int) bool {
		pi, pj := packages[free[i]] != "" && environment[free[i]] == nil, packages[free[j]] != "" && environment[free[j]] == nil
		if pi != pj {
			return pi
		}
		return free[i] < free[j]
	})
	return free
}

// freeIn returns the names body (with its function's signature, if any)
// uses and does not declare. A function literal's names are its own.
func freeIn(body ast.Node, signature *ast.FuncType) map[string]bool {
	declared := map[string]bool{}
	used := map[string]bool{}
	declare := func(e ast.Expr) {
		if id, ok := e.(*ast.Ident); ok {
			declared[id.Name] = true
		}
	}
	var visit func(ast.Node) bool
	visit = func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			for name := range freeIn(n.Body, n.Type) {
				used[name] = true
			}
			return false
		case *ast.RangeStmt:
			if n.Tok == token.DEFINE {
				declare(n.Key)
				declare(n.Value)
			}
		case *ast.AssignStmt:
			if n.Tok == token.DEFINE {
				for _, l := range n.Lhs {
					declare(l)
				}
			}
		case *ast.ValueSpec:
			for _, id := range n.Names {
				declare(id)
			}
		case *ast.Field:
			for _, id := range n.Names {
				declare(id)
			}
		case *ast.SelectorExpr: // X.Sel: Sel is a field, a method, or a package's member
			ast.Inspect(n.X, visit)
			return false
		case *ast.KeyValueExpr:
			if _, ok := n.Key.(*ast.Ident); ok { // a field name
				ast.Inspect(n.Value, visit)
				return false
			}
		case *ast.Ident:
			used[n.Name] = true
		}
		return true
	}
	if signature != nil {
		ast.Inspect(signature, visit)
	}
	ast.Inspect(body, visit)
	for name := range declared {
		delete(used, name)
	}
	return used
}

var universe = map[string]bool{}

func init() {
	for _, name := range strings.Fields(`any bool byte comparable complex64 complex128 error float32 float64
		int int8 int16 int32 int64 rune string uint uint8 uint16 uint32 uint64 uintptr
		true false iota nil append cap clear close complex copy delete imag len make max min new panic
		print println real recover`) {
		universe[name] = true
	}
}

// generate writes the snippet into a function of a package of its own,
// after the declarations of its free names and the imports they all need.
func generate(s *snippet, packages map[string]string) []byte {
	var decls []string
	for i, name := range s.free {
		if options := environment[name]; options != nil {
			decls = append(decls, options[s.choice[i]])
		}
	}
	uses := map[string]bool{}
	for _, name := range s.free {
		if packages[name] != "" && environment[name] == nil {
			uses[name] = true
		}
	}
	for _, d := range decls {
		for _, m := range qualified.FindAllStringSubmatch(d, -1) {
			uses[m[1]] = true
		}
	}
	var imports []string
	for name := range uses {
		imports = append(imports, strconv.Quote(packages[name]))
	}
	sort.Strings(imports)
	var b bytes.Buffer
	b.WriteString("package snippet\n\nimport (\n")
	for _, imp := range imports {
		b.WriteString("\t" + imp + "\n")
	}
	b.WriteString(")\n\n")
	for _, d := range decls {
		b.WriteString(d + "\n\n")
	}
	b.WriteString("func _() error {\n")
	s.genLine = strings.Count(b.String(), "\n") + 1
	b.WriteString(s.code)
	if !endsInReturn(s.code) {
		b.WriteString("return nil\n")
	}
	b.WriteString("}\n")
	return b.Bytes()
}

var qualified = regexp.MustCompile(`\b([a-z][a-z0-9]*)\.[A-Z]`)

func endsInReturn(code string) bool {
	f, err := parser.ParseFile(token.NewFileSet(), "", "package p\nfunc _() {\n"+code+"}\n", 0)
	if err != nil {
		return false
	}
	body := f.Decls[0].(*ast.FuncDecl).Body.List
	if len(body) == 0 {
		return false
	}
	_, ok := body[len(body)-1].(*ast.ReturnStmt)
	return ok
}

// vet runs go vet on the pending snippets' packages and returns the output
// of each that failed.
func vet(t *testing.T, dir string, pending []int) map[int]string {
	args := []string{"vet"}
	for _, i := range pending {
		args = append(args, fmt.Sprintf("./s%d", i))
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = filepath.Join(dir, "snippets")
	cmd.Env = append(os.Environ(), "GOWORK="+filepath.Join(dir, "go.work"), "GOFLAGS=-buildvcs=false")
	out, err := cmd.CombinedOutput()
	failures := map[int]string{}
	if err == nil {
		return failures
	}
	for line := range strings.Lines(string(out)) {
		m := vetLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		i, _ := strconv.Atoi(m[1])
		failures[i] += line
	}
	if len(failures) == 0 {
		t.Fatalf("go vet failed, and named no snippet:\n%s", out)
	}
	return failures
}

var vetLine = regexp.MustCompile(`(?:^|[\s/])s(\d+)/snippet\.go:\d+`)

var genPosition = regexp.MustCompile(`s\d+/snippet\.go:(\d+)(:\d+)?`)

// readmeLines rewrites the generated file's positions in out as the
// README's.
func readmeLines(s *snippet, out string) string {
	return genPosition.ReplaceAllStringFunc(out, func(pos string) string {
		m := genPosition.FindStringSubmatch(pos)
		n, _ := strconv.Atoi(m[1])
		if n < s.genLine {
			return pos + " (the test's declarations)"
		}
		return fmt.Sprintf("README.md:%d%s", s.line+n-s.genLine, m[2])
	})
}

// advance moves the snippet to its next combination of declarations, and
// reports whether there was one.
func advance(s *snippet) bool {
	for i := len(s.free) - 1; i >= 0; i-- {
		options := environment[s.free[i]]
		if s.choice[i]+1 < len(options) {
			s.choice[i]++
			return true
		}
		s.choice[i] = 0
	}
	return false
}
