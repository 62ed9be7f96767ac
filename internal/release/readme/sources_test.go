package readme

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// allSnippets gathers every Go snippet a reader may copy: the ```go blocks
// of the README and of docs/*.md, and the blocks of Go in the package
// documentation of every package of the repository.
func allSnippets(t *testing.T, repo string) []snippet {
	var out []snippet
	markdown := []string{"README.md"}
	docs, err := filepath.Glob(filepath.Join(repo, "docs", "*.md"))
	require.NoError(t, err)
	for _, d := range docs {
		rel, err := filepath.Rel(repo, d)
		require.NoError(t, err)
		markdown = append(markdown, rel)
	}
	for _, name := range markdown {
		text, err := os.ReadFile(filepath.Join(repo, name))
		require.NoError(t, err)
		found := fenced(name, string(text))
		if name == "README.md" {
			require.NotEmpty(t, found, "README.md has no ```go block")
		}
		for _, s := range found {
			checkQuoted(t, repo, s, string(text))
		}
		out = append(out, found...)
	}
	err = filepath.WalkDir(repo, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != repo && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, err := filepath.Rel(repo, path)
		if err != nil {
			return err
		}
		out = append(out, packageDocSnippets(t, path, rel)...)
		return nil
	})
	require.NoError(t, err)
	return out
}

var fence = regexp.MustCompile("(?m)^```go\n((?s:.*?))^```")

// fenced returns the ```go blocks of a Markdown file.
func fenced(file, text string) []snippet {
	var out []snippet
	for _, m := range fence.FindAllStringSubmatchIndex(text, -1) {
		out = append(out, snippet{file: file, line: strings.Count(text[:m[2]], "\n") + 1, code: text[m[2]:m[3]]})
	}
	return out
}

// packageDocSnippets returns the blocks of Go in the package documentation
// of one file: its indented blocks that parse as Go, or that look like Go
// (an assignment, a line that opens a brace) and so must.
func packageDocSnippets(t *testing.T, path, rel string) []snippet {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.PackageClauseOnly|parser.ParseComments)
	require.NoError(t, err)
	if f.Doc == nil {
		return nil
	}
	var out []snippet
	var block *snippet
	flush := func() {
		if block != nil && looksLikeGo(block) {
			out = append(out, *block)
		}
		block = nil
	}
	for _, c := range f.Doc.List {
		code, ok := strings.CutPrefix(c.Text, "//\t")
		if !ok {
			flush()
			continue
		}
		if block == nil {
			block = &snippet{file: rel, line: fset.Position(c.Slash).Line}
		}
		block.code += code + "\n"
	}
	flush()
	return out
}

var goLooking = regexp.MustCompile(`(?m):=|\{$`)

func looksLikeGo(s *snippet) bool {
	if goLooking.MatchString(s.code) {
		return true
	}
	body, decls := s.parts()
	_, err := parser.ParseFile(token.NewFileSet(), "", "package p\n"+decls.text()+"\nfunc _() {\n"+body.text()+"}\n", 0)
	return err == nil
}

var quoteMark = regexp.MustCompile(`^<!-- snippet: (\S+) (\w+) -->$`)

// checkQuoted holds a Markdown snippet marked as a quote of an Example
// function to that function's body: the snippet's lines, one tab deeper,
// are lines the function has, in a row. The Example runs with go test, so
// the quote cannot drift from what works.
func checkQuoted(t *testing.T, repo string, s snippet, text string) {
	all := strings.Split(text, "\n")
	if s.line < 3 {
		return
	}
	m := quoteMark.FindStringSubmatch(all[s.line-3]) // the line before the fence
	if m == nil {
		return
	}
	src, err := os.ReadFile(filepath.Join(repo, m[1]))
	require.NoError(t, err, "%s: the snippet quotes %s", s.where(), m[1])
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, m[1], src, 0)
	require.NoError(t, err)
	var body string
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok && fd.Name.Name == m[2] {
			body = string(src[fset.Position(fd.Body.Lbrace).Offset:fset.Position(fd.Body.Rbrace).Offset])
		}
	}
	require.NotEmpty(t, body, "%s: the snippet quotes %s of %s, which has no such function", s.where(), m[2], m[1])
	var want strings.Builder
	for line := range strings.Lines(s.code) {
		if strings.TrimSpace(line) != "" {
			want.WriteString("\t")
		}
		want.WriteString(line)
	}
	assert.Contains(t, body, want.String(), "%s: the snippet is no longer what %s of %s says", s.where(), m[2], m[1])
}
