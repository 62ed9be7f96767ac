// Package readme tests the Go snippets of the README, of docs/ and of the
// package documentation: each one, pasted where it belongs (statements
// into a function, declarations beside it), must compile and pass go vet.
// A reader who copies one gets working code, errors included.
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
	"slices"
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
	"rdb":  {"var rdb redis.UniversalClient"},
	"idem": {"var idem *idempotency.Middleware"},
	"r":    {"var r chi.Router", "var r *http.Request"},
	"w":    {"var w http.ResponseWriter"},
	"mux":  {"var mux *http.ServeMux"},
	"ctx":  {"var ctx context.Context"},
	"db":   {"var db *sql.DB"},
	"tmpl": {"var tmpl *template.Template"},
	"msg": {"type message struct {\n\tID   string\n\tData []byte\n}\n\n" +
		"func (message) Ack() error                         { return nil }\n" +
		"func (message) NakWithDelay(d time.Duration) error { return nil }\n\n" +
		"var msg message"},
	"Receipt":    {"type Receipt struct{ ID string }"},
	"deadLetter": {"func deadLetter(message, error) {}"},
	"backoff":    {"const backoff = time.Second"},
	"clientID":   {"func clientID(*http.Request) (string, error) { return \"\", nil }"},
	"charge": {
		"func charge(context.Context, []byte) (Receipt, error) { return Receipt{}, nil }",
		"func charge(context.Context, uint64, []byte) (Receipt, error) { return Receipt{}, nil }",
		"func charge(context.Context, *sql.Tx, message) (Receipt, error) { return Receipt{}, nil }",
	},
	"t":                {"var t *testing.T"},
	"url":              {"var url string"},
	"body":             {"var body []byte"},
	"order":            {"var order struct{ PaymentKey string }"},
	"target":           {"var target string"},
	"creds":            {"var creds credentials.TransportCredentials"},
	"tenantOf":         {"func tenantOf(context.Context) (string, error) { return \"\", nil }"},
	"key":              {"var key string"},
	"hc":               {"var hc *http.Client"},
	"answer":           {"var answer idempotency.Answer"},
	"id":               {"var id int64"},
	"amount":           {"var amount int64"},
	"provider":         {"var provider interface {\n\tCharge(ctx context.Context, key string, amount int64) (Receipt, error)\n}"},
	"balance":          {"var balance int64"},
	"orders":           {"var orders optimistic.Table"},
	"orderID":          {"var orderID int64"},
	"receipt":          {"var receipt struct{ ID string }"},
	"outcomes":         {"var outcomes *sqlidem.Store"},
	"errBadTransfer":   {"var errBadTransfer = errors.New(\"bad transfer\")"},
	"handleOrderEvent": {"func handleOrderEvent(http.ResponseWriter, *http.Request) {}"},
	"ack":              {"func ack(Receipt) {}"},
	"transfer":         {"func transfer(*sql.Tx, http.ResponseWriter, *http.Request) error { return nil }"},
	"createOrder":      {"func createOrder(http.ResponseWriter, *http.Request) {}", "func createOrder(*echo.Context) error { return nil }"},
	"createPayment":    {"func createPayment(http.ResponseWriter, *http.Request) {}", "func createPayment(*echo.Context) error { return nil }"},
	"createCharge":     {"func createCharge(http.ResponseWriter, *http.Request) {}"},
	"handleGitHub":     {"func handleGitHub(http.ResponseWriter, *http.Request) {}"},
}

// knownPackages are the packages a snippet may name that are not this
// repository's; the repository's own are found in the tree, so that a
// package that moves is found where it went.
var knownPackages = map[string]string{
	"context":       "context",
	"errors":        "errors",
	"fmt":           "fmt",
	"http":          "net/http",
	"json":          "encoding/json",
	"log":           "log",
	"slog":          "log/slog",
	"sql":           "database/sql",
	"template":      "html/template",
	"time":          "time",
	"bytes":         "bytes",
	"os":            "os",
	"strings":       "strings",
	"testing":       "testing",
	"httptest":      "net/http/httptest",
	"chi":           "github.com/go-chi/chi/v5",
	"redis":         "github.com/redis/go-redis/v9",
	"gin":           "github.com/gin-gonic/gin",
	"echo":          "github.com/labstack/echo/v5",
	"grpc":          "google.golang.org/grpc",
	"codes":         "google.golang.org/grpc/codes",
	"metadata":      "google.golang.org/grpc/metadata",
	"retry":         "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry",
	"credentials":   "google.golang.org/grpc/credentials",
	"retryablehttp": "github.com/hashicorp/go-retryablehttp",
}

// A snippet is one ```go block of a Markdown file, or one block of Go in a
// package's documentation.
type snippet struct {
	file   string // the repository's file, relative to its root
	line   int    // the file's line of its first line of code
	code   string // as the file has it
	free   []string
	choice []int // per free name, which of its declarations
	// The generated file's line of each of the snippet's lines: its
	// statements go in a function, its declarations beside it.
	genLines map[int]int
}

func (s *snippet) where() string { return fmt.Sprintf("%s:%d", s.file, s.line) }

func TestSnippets(t *testing.T) {
	repo, err := filepath.Abs("../../..")
	require.NoError(t, err)
	snippets := allSnippets(t, repo)

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
				t.Errorf("%s: the snippet uses %s, which it does not declare: declare it there, "+
					"or add what a reader would have to the test's environment", s.where(), name)
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
			t.Errorf("%s: the snippet does not compile, or go vet finds fault with it:\n%s\n%s",
				snippets[i].where(), snippets[i].code, sourceLines(&snippets[i], out))
		}
		pending = next
	}
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
	body, decls := s.parts()
	f, err := parser.ParseFile(token.NewFileSet(), "snippet.go", "package p\n"+decls.text()+"\nfunc _() {\n"+body.text()+"}\n", 0)
	require.NoError(t, err, "%s: the snippet does not parse as statements (with declarations of its own)", s.where())
	declared := map[string]bool{}
	used := map[string]bool{}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil && d.Name.Name != "_" {
				declared[d.Name.Name] = true
			}
			names := freeIn(d.Body, d.Type)
			if d.Recv != nil {
				for _, field := range d.Recv.List {
					for name := range freeIn(field.Type, nil) {
						names[name] = true
					}
				}
			}
			for name := range names {
				used[name] = true
			}
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				if ts, ok := spec.(*ast.TypeSpec); ok {
					declared[ts.Name.Name] = true
					for name := range freeIn(ts.Type, nil) {
						used[name] = true
					}
				}
			}
		}
	}
	var free []string
	for name := range used {
		if name != "_" && !universe[name] && !declared[name] {
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

// generate writes the snippet into a package of its own: its statements
// into a function, its declarations beside it, after the declarations of
// its free names and the imports they all need.
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
	s.genLines = map[int]int{}
	write := func(ls lines) {
		for _, l := range ls {
			s.genLines[strings.Count(b.String(), "\n")+1] = l.n
			b.WriteString(l.text + "\n")
		}
	}
	body, own := s.parts()
	write(own)
	if slices.Contains(s.free, "w") {
		// Statements that answer through w go in an HTTP handler, which
		// returns nothing: a snippet that returns an error there would
		// not compile where it is pasted.
		b.WriteString("\nfunc _() {\n")
		write(used(body))
	} else {
		b.WriteString("\nfunc _() error {\n")
		write(used(body))
		if !endsInReturn(body.text()) {
			b.WriteString("return nil\n")
		}
	}
	b.WriteString("}\n")
	return b.Bytes()
}

// used returns the statements with each variable they declare at the top
// level marked used where it is declared: a snippet is an excerpt, and the
// code a reader pastes it into goes on to use what it declares.
func used(body lines) lines {
	if len(body) == 0 {
		return body
	}
	const head = "package p\nfunc _() {\n"
	text := body.text()
	f, err := parser.ParseFile(token.NewFileSet(), "", head+text+"}\n", 0)
	if err != nil {
		return body // go vet will say what is wrong
	}
	stmts := f.Decls[0].(*ast.FuncDecl).Body.List
	for i := len(stmts) - 1; i >= 0; i-- {
		var names []string
		switch st := stmts[i].(type) {
		case *ast.AssignStmt:
			if st.Tok == token.DEFINE {
				for _, l := range st.Lhs {
					names = append(names, l.(*ast.Ident).Name)
				}
			}
		case *ast.DeclStmt:
			if gd, ok := st.Decl.(*ast.GenDecl); ok && gd.Tok == token.VAR {
				for _, spec := range gd.Specs {
					for _, id := range spec.(*ast.ValueSpec).Names {
						names = append(names, id.Name)
					}
				}
			}
		}
		var mark strings.Builder
		for _, name := range names {
			if name != "_" {
				mark.WriteString("; _ = " + name)
			}
		}
		at := int(stmts[i].End()) - 1 - len(head) // token.Pos counts from 1
		text = text[:at] + mark.String() + text[at:]
	}
	out := make(lines, len(body))
	for i, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		out[i] = body[i]
		out[i].text = line
	}
	return out
}

// lines are some of a snippet's lines, each with its number in the file.
type lines []struct {
	n    int
	text string
}

func (ls lines) text() string {
	var b strings.Builder
	for _, l := range ls {
		b.WriteString(l.text + "\n")
	}
	return b.String()
}

// parts splits the snippet into its statements and its own top-level
// declarations: a func or type at the left margin, to the closing brace
// at the margin. An import line is left out, since the test imports what
// the snippet names.
func (s *snippet) parts() (body, decls lines) {
	inDecl := false
	for i, text := range strings.Split(strings.TrimSuffix(s.code, "\n"), "\n") {
		l := struct {
			n    int
			text string
		}{s.line + i, text}
		switch {
		case inDecl:
			decls = append(decls, l)
			inDecl = text != "}"
		case strings.HasPrefix(text, "func ") || strings.HasPrefix(text, "type "):
			decls = append(decls, l)
			inDecl = strings.HasSuffix(text, "{")
		case strings.HasPrefix(text, "import "):
		default:
			body = append(body, l)
		}
	}
	return body, decls
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

// sourceLines rewrites the generated file's positions in out as the
// snippet's file's.
func sourceLines(s *snippet, out string) string {
	return genPosition.ReplaceAllStringFunc(out, func(pos string) string {
		m := genPosition.FindStringSubmatch(pos)
		n, _ := strconv.Atoi(m[1])
		line, ok := s.genLines[n]
		if !ok {
			return pos + " (the test's declarations)"
		}
		return fmt.Sprintf("%s:%d%s", s.file, line, m[2])
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
