package idempotency

import (
	"strconv"

	"github.com/onceonly/idempotency/internal/keyspace"
)

// A key's record in Redis is one string, laid out once in each language:
// internal/keyspace's lua/record.lua, built into every script that reads
// or writes one, and keyspace.Record in Go. testdata/records holds a
// record of each state as the scripts write it (recordgolden_test.go).

// decodeRecord reads a stored answer from the record text a claim replied.
func decodeRecord(text string) (*record, error) {
	r, ok := keyspace.ParseRecord(text)
	if !ok {
		return nil, errCorruptRecord
	}
	status, err := strconv.Atoi(r.Status)
	if err != nil || status < 100 || status > 999 {
		return nil, errCorruptRecord
	}
	header, err := decodeHeader(r.Header)
	if err != nil {
		return nil, err
	}
	return newRecord(status, header, []byte(r.Body)), nil
}

// completionTexts are the two records complete.lua takes, in one
// allocation: the record to store (its state, the claim's fields, the
// answer) and the record as the claim wrote it, which the script compares
// with what the key holds.
type completionTexts struct {
	buf     []byte
	claimed int // buf[:claimed] is the claimed record, the rest the one to store
}

// newCompletionTexts builds the texts for an answer, rec (nil: executed,
// not replayable), to a claim with fingerprint fp, lock value lockValue
// and fence.
func newCompletionTexts(fp, lockValue string, fence uint64, rec *record) *completionTexts {
	state, status, header, body := "big", 0, []string(nil), []byte(nil)
	if rec != nil {
		state, status, header, body = "done", rec.status, rec.header, rec.body
	}
	headerLen := headerSize(header)
	line := len(fp) + len(lockValue) + 30 // with the fence, the executions and the separators
	b := make([]byte, 0, 2*line+len(state)+16+headerLen+len(body))
	b = keyspace.AppendClaimLine(b, "run", fp, lockValue, fence)
	claimed := len(b)
	b = keyspace.AppendClaimLine(b, state, fp, lockValue, fence)
	b = keyspace.AppendAnswerHead(b, status, headerLen)
	b = append(appendHeader(b, header), body...)
	return &completionTexts{buf: b, claimed: claimed}
}

// The texts as script arguments, without boxing a slice: go-redis writes
// what MarshalBinary returns.
type (
	storedText  completionTexts
	claimedText completionTexts
)

func (t *storedText) MarshalBinary() ([]byte, error)  { return t.buf[t.claimed:], nil }
func (t *claimedText) MarshalBinary() ([]byte, error) { return t.buf[:t.claimed], nil }
