package idempotency

import (
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
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
// come from another configuration or version), with its body decoded
// from its Content-Encoding when decode is set (see negotiate). Header
// values are copied, in one allocation, so that code after us that edits
// a header in place cannot change the record for the next duplicate. A
// stored header joins what the replaying request's outer layers set when
// it is a list they may add to as well (joined), and replaces it
// otherwise, as the handler's Set did on the first answer. Trailers are
// declared, and sent after the body. No Content-Length is forced: net/http
// computes it for what is actually sent, and a transform outside us
// (compression) would contradict one computed here.
func (rec *record) write(w http.ResponseWriter, r *http.Request, cfg *config, decode bool) {
	var dec decoding
	if decode {
		var err error
		dec, err = rec.decodingOf(cfg.decodedLimit())
		switch {
		case errors.Is(err, errDecodedTooLarge):
			// Far past what the middleware would store (a compression
			// bomb): only the coded body may go out, to a request that
			// accepts it.
			cfg.errorHandler(w, r, ErrNotAcceptable)
			return
		case err != nil:
			cfg.logger.Error("idempotency: a stored answer's body cannot be decoded from its Content-Encoding "+
				"for a request that does not accept it; such requests get the unreadable-record problem",
				"coding", dec.coding, "path", r.URL.Path, "error", err)
			cfg.errorHandler(w, r, ErrUnreadableRecord)
			return
		}
	}
	h := w.Header()
	block := make([]string, 0, len(rec.header)/2+1)
	trailers := false
	for i := 0; i < len(rec.header); {
		name, start := rec.header[i], len(block)
		keep := rec.keeps(name, cfg, decode)
		if strings.HasPrefix(name, http.TrailerPrefix) {
			trailers, keep = trailers || keep, false
		}
		tag := decode && strings.EqualFold(name, "Etag")
		for ; i < len(rec.header) && rec.header[i] == name; i += 2 {
			switch {
			case keep && tag:
				block = append(block, decodedTag(rec.header[i+1]))
			case keep:
				block = append(block, rec.header[i+1])
			}
		}
		if keep {
			setStored(h, name, block[start:len(block):len(block)])
		}
	}
	block = append(block, replayedValue[0])
	n := len(block)
	h[ReplayedHeader] = block[n-1 : n : n]
	if trailers {
		rec.declareTrailers(h, cfg)
	}
	if cfg.expiryHeader != "" {
		cfg.stampExpiry(h, time.Until(rec.expires))
	}
	if cfg.replayHook != nil {
		cfg.replayHook(r, rec.status, h)
	}
	w.WriteHeader(rec.status)
	if decode {
		dec.to(w, rec.body) // it decoded above: only the client can fail it now
	} else {
		w.Write(rec.body)
	}
	if trailers {
		rec.sendTrailers(h, cfg)
	}
}

// keeps reports whether a replay sends the stored pair named name: not a
// varied request value, not the coding of a body sent decoded, and only
// what cfg stores.
func (rec *record) keeps(name string, cfg *config, decode bool) bool {
	if strings.HasPrefix(name, varyPrefix) ||
		decode && (strings.EqualFold(name, "Content-Encoding") || codedOnly[http.CanonicalHeaderKey(name)]) {
		return false
	}
	return rec.filtered || cfg.storable(http.CanonicalHeaderKey(strings.TrimPrefix(name, http.TrailerPrefix)))
}

// declareTrailers names the stored trailers in the Trailer header, after
// any an outer layer declared.
func (rec *record) declareTrailers(h http.Header, cfg *config) {
	var names []string
	for i := 0; i < len(rec.header); i += 2 {
		name := rec.header[i]
		if trailer, ok := strings.CutPrefix(name, http.TrailerPrefix); ok && rec.keeps(name, cfg, false) &&
			(len(names) == 0 || names[len(names)-1] != trailer) {
			names = append(names, trailer)
		}
	}
	if len(names) > 0 {
		h["Trailer"] = append(h["Trailer"][:len(h["Trailer"]):len(h["Trailer"])], strings.Join(names, ", "))
	}
}

// sendTrailers sets the stored trailers' values once the body is out, in
// place of a header of the same name sent before it.
func (rec *record) sendTrailers(h http.Header, cfg *config) {
	for i := 0; i < len(rec.header); i += 2 {
		name := rec.header[i]
		if trailer, ok := strings.CutPrefix(name, http.TrailerPrefix); ok && rec.keeps(name, cfg, false) {
			if i == 0 || rec.header[i-2] != name {
				h[trailer] = nil
			}
			h[trailer] = append(h[trailer], rec.header[i+1])
		}
	}
}

// joinedOnReplay are the list headers that outer layers commonly add to as
// well (a session layer's cookie, a CORS layer's Vary): a replay appends
// the stored values to theirs. Every other stored header replaces the
// outer layers' value of its name, as a handler's Set does (Content-Type,
// Location, Cache-Control, ETag, …).
var joinedOnReplay = map[string]bool{
	"Vary": true, "Set-Cookie": true, "Link": true, "Via": true, "Server-Timing": true,
	"Www-Authenticate": true, "Access-Control-Expose-Headers": true,
	"Access-Control-Allow-Headers": true, "Access-Control-Allow-Methods": true,
}

// setStored puts a stored header's values into a replay's header map.
func setStored(h http.Header, name string, values []string) {
	if outer := h[name]; len(outer) > 0 && joinedOnReplay[http.CanonicalHeaderKey(name)] {
		values = append(outer[:len(outer):len(outer)], values...)
	}
	h[name] = values
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
	if strings.HasPrefix(name, varyPrefix) {
		return true // the request's values, which the replay checks
	}
	name = strings.TrimPrefix(name, http.TrailerPrefix)
	if c.replayHeaders != nil {
		// Content-Encoding says what the stored bytes are: without it a
		// compressed body would replay as if it were plain.
		return (c.replayHeaders[name] || name == "Content-Encoding") && !hopByHop[name]
	}
	return name != "Set-Cookie" && !hopByHop[name]
}

// headerName reports whether name, past the prefix of a trailer or of a
// varied request header, is a field name net/http would send: one it
// would drop (empty, or with a space or a colon) is not stored, since no
// replay could read it back.
func headerName(name string) bool {
	name = strings.TrimPrefix(name, http.TrailerPrefix)
	return isHTTPToken(strings.TrimPrefix(name, varyPrefix))
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
		if !headerName(canonical) || !m.cfg.storable(canonical) {
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
