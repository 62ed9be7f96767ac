package idempotency

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
)

// ReplayedHeader marks a response that was replayed from a stored record.
const ReplayedHeader = "Idempotent-Replayed"

// A record is a completed response as stored for replay. It never changes
// once built, so one record serves every duplicate, concurrently.
type record struct {
	status int
	// header holds name, value, name, value, …, with the values of one name
	// next to each other: a flat slice decodes in one allocation.
	header        []string
	body          []byte
	contentLength string
}

func newRecord(status int, header []string, body []byte) *record {
	return &record{status: status, header: header, body: body, contentLength: strconv.Itoa(len(body))}
}

// size estimates the memory a record holds.
func (rec *record) size() int64 {
	n := int64(len(rec.body)) + 128
	for _, s := range rec.header {
		n += int64(len(s)) + 16
	}
	return n
}

// write replays rec to w. Header values are copied, in one allocation, so
// that code after us that edits a header in place cannot change the record
// for the next duplicate.
func (rec *record) write(w http.ResponseWriter) {
	h := w.Header()
	block := make([]string, 0, len(rec.header)/2+2)
	for i := 0; i < len(rec.header); {
		name, start := rec.header[i], len(block)
		for ; i < len(rec.header) && rec.header[i] == name; i += 2 {
			block = append(block, rec.header[i+1])
		}
		h[name] = block[start:len(block):len(block)]
	}
	block = append(block, "true", rec.contentLength)
	n := len(block)
	h[ReplayedHeader] = block[n-2 : n-1 : n-1]
	h["Content-Length"] = block[n-1 : n : n]
	w.WriteHeader(rec.status)
	w.Write(rec.body)
}

// hopByHop headers describe one connection and never belong in a replay.
var hopByHop = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Proxy-Connection": true, "Te": true,
	"Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	// Recomputed for every response.
	"Content-Length": true, "Date": true,
}

// storable reports whether a response header is kept for replay.
func (c *config) storable(name string) bool {
	if c.replayHeaders != nil {
		return c.replayHeaders[name]
	}
	return name != "Set-Cookie" && !hopByHop[name]
}

// encodeHeader writes header pairs as "Name: value" lines. HTTP forbids CR
// and LF in names and values, so a newline never occurs inside one.
func encodeHeader(pairs []string) string {
	var b strings.Builder
	for i := 0; i+1 < len(pairs); i += 2 {
		b.WriteString(pairs[i])
		b.WriteString(": ")
		b.WriteString(pairs[i+1])
		b.WriteByte('\n')
	}
	return b.String()
}

var errCorruptHeader = errors.New("idempotency: corrupt stored header")

// decodeHeader reads what encodeHeader wrote. The pairs are substrings of s.
func decodeHeader(s string) ([]string, error) {
	if s == "" {
		return nil, nil
	}
	pairs := make([]string, 0, 2*strings.Count(s, "\n"))
	for s != "" {
		line, rest, ok := strings.Cut(s, "\n")
		if !ok {
			return nil, errCorruptHeader
		}
		name, value, ok := strings.Cut(line, ": ")
		if !ok || name == "" {
			return nil, errCorruptHeader
		}
		pairs = append(pairs, name, value)
		s = rest
	}
	return pairs, nil
}
