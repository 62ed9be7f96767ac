package main

import (
	"fmt"
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
