package route

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Percent-escapes of unreserved characters are the characters themselves;
// every other escape stays.
func TestUnreserved(t *testing.T) {
	require.Equal(t, "/pay", unreserved("/%70ay"))
	require.Equal(t, "/a%2Fb", unreserved("/a%2Fb"))
	require.Equal(t, "/~x%20y%", unreserved("/%7Ex%20y%"))
	require.Equal(t, "/%zz", unreserved("/%zz"))
}
