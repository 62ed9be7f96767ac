package idempotency

import (
	"strconv"

	"github.com/onceonly/idempotency/internal/keyspace"
)

// A key's record in Redis is one string (keyspace.Record lays it out),
// which the scripts in lua/ write and read.

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
	fields := len(fp) + len(lockValue) + 30 // with the fence, the executions and the separators
	b := make([]byte, 0, 2*fields+len(state)+16+headerLen+len(body))
	b = appendClaimFields(append(b, "run"...), fp, lockValue, fence)
	claimed := len(b)
	b = append(append(b, state...), b[len("run"):claimed]...)
	b = append(strconv.AppendInt(b, int64(status), 10), ' ')
	b = append(strconv.AppendInt(b, int64(headerLen), 10), '\n')
	b = append(appendHeader(b, header), body...)
	return &completionTexts{buf: b, claimed: claimed}
}

// appendClaimFields appends the fields a fresh claim writes after its
// state (claim.lua): a space, then the fingerprint, the lock value, the
// fence, one execution, four empty fields, and the line's end.
func appendClaimFields(b []byte, fp, lockValue string, fence uint64) []byte {
	b = append(append(append(append(b, ' '), fp...), ' '), lockValue...)
	b = strconv.AppendUint(append(b, ' '), fence, 10)
	return append(b, " 1    \n"...)
}

// The texts as script arguments, without boxing a slice: go-redis writes
// what MarshalBinary returns.
type (
	storedText  completionTexts
	claimedText completionTexts
)

func (t *storedText) MarshalBinary() ([]byte, error)  { return t.buf[t.claimed:], nil }
func (t *claimedText) MarshalBinary() ([]byte, error) { return t.buf[:t.claimed], nil }
