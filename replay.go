package idempotency

import (
	"net/http"
	"slices"
	"strconv"
	"time"
)

// ReplayedHeader marks a response that was replayed from a stored record.
const ReplayedHeader = "Idempotent-Replayed"

// A record is a completed response as stored for replay. It never changes
// once built, so one record serves every duplicate, concurrently.
type record struct {
	status int
	// header holds name, value, name, value, …, with the values of one name
	// next to each other: a flat slice decodes in one allocation.
	header []string
	body   []byte
	// expires is when the stored record ends, as far as this process knows;
	// set before the record is shared.
	expires time.Time
	// filtered: the header holds only what this process's policy stores
	// (the recorder made it), so a replay need not filter it again.
	filtered bool
}

func newRecord(status int, header []string, body []byte) *record {
	return &record{status: status, header: header, body: body}
}

// size estimates the memory a record holds.
func (rec *record) size() int64 {
	n := int64(len(rec.body)) + 128
	for _, s := range rec.header {
		n += int64(len(s)) + 16
	}
	return n
}

// replayedValue is shared by every replay; write copies it into place.
var replayedValue = []string{"true"}

// write replays rec to w, keeping only the headers that cfg stores
// (the record was filtered when it was made, but one read from Redis may
// come from another configuration or version). Header values are copied,
// in one allocation, so that code after us that edits a header in place
// cannot change the record for the next duplicate. No Content-Length is
// forced: net/http computes it for what is actually sent, and a transform
// outside us (compression) would contradict one computed here.
func (rec *record) write(w http.ResponseWriter, r *http.Request, cfg *config) {
	h := w.Header()
	block := make([]string, 0, len(rec.header)/2+1)
	for i := 0; i < len(rec.header); {
		name, start := rec.header[i], len(block)
		keep := rec.filtered || cfg.storable(http.CanonicalHeaderKey(name))
		for ; i < len(rec.header) && rec.header[i] == name; i += 2 {
			if keep {
				block = append(block, rec.header[i+1])
			}
		}
		if keep {
			h[name] = block[start:len(block):len(block)]
		}
	}
	block = append(block, replayedValue[0])
	n := len(block)
	h[ReplayedHeader] = block[n-1 : n : n]
	if cfg.expiryHeader != "" {
		cfg.stampExpiry(h, time.Until(rec.expires))
	}
	if cfg.replayHook != nil {
		cfg.replayHook(r, rec.status, h)
	}
	w.WriteHeader(rec.status)
	w.Write(rec.body)
}

// stampExpiry sets the expiry header (WithExpiryHeader) to the whole
// seconds a stored answer is still replayed.
func (c *config) stampExpiry(h http.Header, left time.Duration) {
	h[c.expiryHeader] = []string{strconv.FormatInt(int64(max(left, 0)/time.Second), 10)}
}

// hopByHop headers describe one connection and never belong in a replay.
var hopByHop = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Proxy-Connection": true, "Te": true,
	"Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	// Recomputed for every response.
	"Content-Length": true, "Date": true,
	// Ours: a replay marks itself.
	ReplayedHeader: true,
}

// storable reports whether a response header is kept for replay.
func (c *config) storable(name string) bool {
	if c.replayHeaders != nil {
		return c.replayHeaders[name] && !hopByHop[name]
	}
	return name != "Set-Cookie" && !hopByHop[name]
}

// recordOf turns an answer an outcome store committed (or an operator
// gives) into a record, keeping the headers this middleware stores, in a
// stable order. A name the handler set without canonicalising it
// (h["ETag"]) is kept under its canonical name, as net/http sends it.
func (m *Middleware) recordOf(a Answer) *record {
	names := make([]string, 0, len(a.Header))
	values := make(map[string][]string, len(a.Header))
	for name, vs := range a.Header {
		canonical := http.CanonicalHeaderKey(name)
		if !m.cfg.storable(canonical) {
			continue
		}
		if _, seen := values[canonical]; !seen {
			names = append(names, canonical)
		}
		values[canonical] = append(values[canonical], vs...)
	}
	slices.Sort(names)
	var pairs []string
	for _, name := range names {
		for _, v := range values[name] {
			pairs = append(pairs, name, v)
		}
	}
	rec := newRecord(a.Status, pairs, a.Body)
	rec.filtered = true
	return rec
}
