package main

import (
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A long failure keeps its first lines and its last, where a test says
// what broke, and a short one beside it is printed whole.
func TestRecapKeepsEachFailuresEnds(t *testing.T) {
	var long strings.Builder
	for i := 1; i <= 300; i++ {
		fmt.Fprintf(&long, "line %d\n", i)
	}
	long.WriteString("RULE BROKEN: the last line\n")
	var out strings.Builder
	printRecap(&out, []string{long.String(), "", "    a_test.go:3: boom\n"}, 40)

	got := out.String()
	assert.True(t, strings.HasPrefix(got, "line 1\n"), "the first lines of the long failure come first")
	assert.Contains(t, got, "RULE BROKEN: the last line\n")
	assert.Contains(t, got, "lines left out")
	assert.True(t, strings.HasSuffix(got, "    a_test.go:3: boom\n"), "the short failure is printed whole")
	require.LessOrEqual(t, strings.Count(got, "\n"), 42)
}

// A package that fails outside any test's end (a timeout's panic, a
// TestMain that exits, a build that fails) is recapped with what it and
// the tests it cut short printed; many failures stay within the limit.
func TestRecapOfAPackageThatFailedOutsideATest(t *testing.T) {
	events := strings.Join([]string{
		`{"Action":"start","Package":"p"}`,
		`{"Action":"run","Package":"p","Test":"TestHangs"}`,
		`{"Action":"output","Package":"p","Test":"TestHangs","Output":"=== RUN   TestHangs\n"}`,
		`{"Action":"output","Package":"p","Test":"TestHangs","Output":"panic: test timed out after 3s\n"}`,
		`{"Action":"output","Package":"p","Output":"FAIL\tp\t3.0s\n"}`,
		`{"Action":"fail","Package":"p","Elapsed":3}`,
		`{"ImportPath":"q [q.test]","Action":"build-output","Output":"q/q_test.go:3:1: syntax error\n"}`,
		`{"ImportPath":"q [q.test]","Action":"build-fail"}`,
	}, "\n")
	p := newProgress(io.Discard, false)
	require.True(t, p.read(strings.NewReader(events)))
	var out strings.Builder
	printRecap(&out, p.failures, 120)
	assert.Contains(t, out.String(), "panic: test timed out after 3s")
	assert.Contains(t, out.String(), "FAIL\tp\t3.0s")
	assert.Contains(t, out.String(), "syntax error")

	many := make([]string, 40)
	for i := range many {
		many[i] = fmt.Sprintf("failure %d\n", i)
	}
	out.Reset()
	printRecap(&out, many, 120)
	assert.LessOrEqual(t, strings.Count(out.String(), "\n"), 121)
	assert.Contains(t, out.String(), "and 25 more failures")
}
