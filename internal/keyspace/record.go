package keyspace

import (
	"strconv"
	"strings"
)

// Record is a key's record as the scripts lay it out (lua/claim.lua in
// the root): one string, a line of nine space-separated fields, then the
// answer.
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
	var b strings.Builder
	for i, f := range []string{r.State, r.Fingerprint, r.Owner, r.Fence, r.Executions,
		r.PrevOwner, r.PrevFence, r.WrittenBack, r.Settled} {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(f)
	}
	b.WriteByte('\n')
	if r.State == "run" {
		b.WriteString(r.Journal)
	}
	if r.Status != "" || r.Header != "" || r.Body != "" {
		b.WriteString(r.Status + " " + strconv.Itoa(len(r.Header)) + "\n" + r.Header + r.Body)
	}
	return b.String()
}
