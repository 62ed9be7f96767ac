package main

import (
	"encoding/binary"
	"net/http"
)

// Answers are kept with these headers only, as idemlease's default list.
var storedHeaders = []string{"Content-Type", "Content-Language", "Content-Encoding", "Content-Disposition", "Location"}

// recorder passes the answer through and keeps a copy for the record.
type recorder struct {
	http.ResponseWriter
	status   int
	body     []byte
	overflow bool
}

func (c *recorder) WriteHeader(status int) {
	if c.status == 0 {
		c.status = status
	}
	c.ResponseWriter.WriteHeader(status)
}

func (c *recorder) Write(b []byte) (int, error) {
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	if len(c.body)+len(b) > maxBody {
		c.overflow = true
	} else {
		c.body = append(c.body, b...)
	}
	return c.ResponseWriter.Write(b)
}

// payload encodes the answer: the status, then each stored header as
// name and value, each length-prefixed, then the body.
func (c *recorder) payload() []byte {
	p := binary.AppendUvarint(nil, uint64(c.status))
	h := c.Header()
	for _, name := range storedHeaders {
		for _, v := range h[name] {
			p = appendString(p, name)
			p = appendString(p, v)
		}
	}
	p = appendString(p, "")
	return append(p, c.body...)
}

func appendString(p []byte, s string) []byte {
	p = binary.AppendUvarint(p, uint64(len(s)))
	return append(p, s...)
}

// replay writes a stored answer back, marked as a replay.
func replay(w http.ResponseWriter, payload []byte) {
	status, n := binary.Uvarint(payload)
	if n <= 0 {
		problem(w, http.StatusInternalServerError, "corrupt-record")
		return
	}
	p := payload[n:]
	h := w.Header()
	for {
		name, rest, ok := readString(p)
		if !ok {
			problem(w, http.StatusInternalServerError, "corrupt-record")
			return
		}
		p = rest
		if name == "" {
			break
		}
		value, rest, ok := readString(p)
		if !ok {
			problem(w, http.StatusInternalServerError, "corrupt-record")
			return
		}
		p = rest
		h.Add(name, value)
	}
	h.Set(ReplayedHeader, "true")
	w.WriteHeader(int(status))
	w.Write(p)
}

func readString(p []byte) (string, []byte, bool) {
	l, n := binary.Uvarint(p)
	if n <= 0 || uint64(len(p)-n) < l {
		return "", nil, false
	}
	return string(p[n : n+int(l)]), p[n+int(l):], true
}
