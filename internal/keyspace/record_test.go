package keyspace

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A record reads back as written, and what claim.lua writes parses.
func TestRecordRoundTrip(t *testing.T) {
	for _, r := range []Record{
		{State: "run", Fingerprint: "ab12", Owner: "lock-value", Fence: "1795545899564249", Executions: "1"},
		{State: "run", Fingerprint: "ab12", Owner: "new", Fence: "7", Executions: "2", PrevOwner: "old", PrevFence: "6"},
		{State: "done", Fingerprint: "ab12", Owner: "o", Fence: "7", Executions: "1", WrittenBack: "1",
			Status: "201", Header: "\x01\x04Name\x05value", Body: "body\nwith\nnewlines and spaces"},
		{State: "big", Fingerprint: "ab12", Fence: "7", Executions: "1", Settled: "a:0123456789abcdef:lock", Status: "0"},
		{State: "forgotten", Settled: "f:lock"},
	} {
		got, ok := ParseRecord(r.String())
		require.True(t, ok, "%q", r.String())
		require.Equal(t, r, got)
	}
	got, ok := ParseRecord("run ab12 lock 1795545899564249 1    \n")
	require.True(t, ok)
	require.Equal(t, Record{State: "run", Fingerprint: "ab12", Owner: "lock", Fence: "1795545899564249", Executions: "1"}, got)
	for _, text := range []string{"", "run", "run a b c\n", "done a b 1 1    \n201 99\nshort", "done a b 1 1    \n201\n"} {
		_, ok := ParseRecord(text)
		require.False(t, ok, "%q", text)
	}
}

// The middleware builds the record it stores over its own claim from
// AppendClaimLine and AppendAnswerHead: the same text as the record those
// fields make.
func TestAppendedRecordIsTheRecord(t *testing.T) {
	b := AppendClaimLine(nil, "done", "ab12", "lock-value", 1795545899564249)
	b = append(AppendAnswerHead(b, 201, 4), "\x01\x01a\x00body"...)
	want := Record{State: "done", Fingerprint: "ab12", Owner: "lock-value", Fence: "1795545899564249",
		Executions: "1", Status: "201", Header: "\x01\x01a\x00", Body: "body"}
	require.Equal(t, want.String(), string(b))
	got, ok := ParseRecord(string(b))
	require.True(t, ok)
	require.Equal(t, want, got)
}

func TestClaimLineAround(t *testing.T) {
	before, after := ClaimLineAround("fp0", "owner-1")
	require.Equal(t, string(AppendClaimLine(nil, "run", "fp0", "owner-1", 1765000000123456)),
		before+"1765000000123456"+after)
}
