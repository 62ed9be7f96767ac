package keyspace

import (
	"strconv"
	"strings"
)

// Record is a key's record as the scripts lay it out (lua/record.lua,
// built into every script that reads or writes one): one string, a line of
// nine space-separated fields, then the answer.
//
//	state fingerprint owner fence executions prev-owner prev-fence written-back settled\n
//	status header-length\n header-block body
//
// No field of the first line holds a space: lock values are base64url, the
// fingerprint is hex, the rest are words and numbers. A record that is
// claimed and not yet answered has no answer: after the first line comes
// the journal of its run's steps (journal.go in the root), often empty. One string
// rather than a hash of fields: GET and SET cost Redis less than HMGET and
// HSET, and a claim's SET sets the record's lifetime in the same command.
type Record struct {
	State       string // run, done, big or forgotten
	Fingerprint string
	Owner       string // the executor's lock value
	Fence       string
	Executions  string
	// PrevOwner and PrevFence are the executor a takeover took the key
	// from, whom undoing the takeover hands it back to.
	PrevOwner, PrevFence string
	WrittenBack          string // "1": the store wrote a vanished record back
	Settled              string // the mark of the operator's settle.lua
	// The answer: "" for a record without one.
	Status, Header, Body string
	Journal              string // a run's step journal, raw (state run only)
}

// ParseRecord reads a record's text; ok is false for text that is not
// one. The fields are substrings of text.
func ParseRecord(text string) (r Record, ok bool) {
	line, answer, ok := strings.Cut(text, "\n")
	if !ok {
		return Record{}, false
	}
	fields := [9]*string{&r.State, &r.Fingerprint, &r.Owner, &r.Fence, &r.Executions,
		&r.PrevOwner, &r.PrevFence, &r.WrittenBack, &r.Settled}
	for i, f := range fields {
		if i == len(fields)-1 {
			*f = line
			break
		}
		if *f, line, ok = strings.Cut(line, " "); !ok {
			return Record{}, false
		}
	}
	if r.State == "" || strings.Contains(r.Settled, " ") {
		return Record{}, false
	}
	if answer == "" {
		return r, true
	}
	if r.State == "run" {
		r.Journal = answer
		return r, true
	}
	head, rest, ok := strings.Cut(answer, "\n")
	status, length, ok2 := strings.Cut(head, " ")
	n, err := strconv.Atoi(length)
	if !ok || !ok2 || err != nil || n < 0 || n > len(rest) {
		return Record{}, false
	}
	r.Status, r.Header, r.Body = status, rest[:n], rest[n:]
	return r, true
}

// String is the record's text, as the scripts write it.
func (r Record) String() string {
	b := appendLine(nil, [...]string{r.State, r.Fingerprint, r.Owner, r.Fence, r.Executions,
		r.PrevOwner, r.PrevFence, r.WrittenBack, r.Settled})
	if r.State == "run" {
		b = append(b, r.Journal...)
	}
	if r.Status != "" || r.Header != "" || r.Body != "" {
		b = append(append(append(b, r.Status...), ' '), strconv.Itoa(len(r.Header))...)
		b = append(append(append(b, '\n'), r.Header...), r.Body...)
	}
	return string(b)
}

// appendLine appends a record's line: its nine fields, as record.lua's
// recordLine writes them.
func appendLine(b []byte, fields [9]string) []byte {
	for i, f := range fields {
		if i > 0 {
			b = append(b, ' ')
		}
		b = append(b, f...)
	}
	return append(b, '\n')
}

// AppendClaimLine appends the line of a record that a fresh claim wrote
// (claim.lua), in state: the fingerprint, the owner's lock value, the
// fence and one execution, and empty the fields that only a takeover, a
// write-back or a settle fills. What the middleware stores over its own
// claim (complete.lua) is built from it, without boxing nine strings.
func AppendClaimLine(b []byte, state, fp, owner string, fence uint64) []byte {
	b = append(append(append(append(append(b, state...), ' '), fp...), ' '), owner...)
	b = strconv.AppendUint(append(b, ' '), fence, 10)
	return append(b, " 1    \n"...)
}

// AppendAnswerHead appends the head of a finished record's answer, which
// follows its line: the status and the header block's length, then a
// newline. The header block and the body come after it.
func AppendAnswerHead(b []byte, status, headerLen int) []byte {
	b = append(strconv.AppendInt(b, int64(status), 10), ' ')
	return append(strconv.AppendInt(b, int64(headerLen), 10), '\n')
}

// ClaimLineAround is the line of a fresh claim (AppendClaimLine's, in
// state run) without its fence: what comes before the fence and what
// after it. A store that takes the fence from its database's clock in the
// statement that writes the record puts it between the two.
func ClaimLineAround(fp, owner string) (before, after string) {
	line := string(AppendClaimLine(nil, "run", fp, owner, 0))
	at := len("run") + 1 + len(fp) + 1 + len(owner) + 1
	return line[:at], line[at+1:]
}
