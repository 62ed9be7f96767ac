package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The list moves with the code: every mutant still finds its text once,
// and changes it.
func TestEveryMutantApplies(t *testing.T) {
	require.GreaterOrEqual(t, len(mutants), 30)
	names := map[string]bool{}
	for _, m := range mutants {
		t.Run(m.name, func(t *testing.T) {
			assert.False(t, names[m.name], "two mutants are named %s", m.name)
			names[m.name] = true
			src, err := os.ReadFile(filepath.Join("..", "..", m.file))
			require.NoError(t, err)
			out, err := m.apply(src)
			require.NoError(t, err)
			assert.NotEqual(t, string(src), string(out))
			assert.NotEmpty(t, m.breaks)
			assert.NotEmpty(t, m.tests, "the unit tests that guard the line")
			assert.True(t, m.unseen != "" || m.faults != "" || m.steps, "the faults that show it, or why none can")
		})
	}
}
