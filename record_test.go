package idempotency

import (
	"bytes"
	"net/http/httptest"
	"strconv"
	"testing"
)

// The stored-record decoder meets whatever Redis hands back: it must refuse
// what it cannot read, never panic, and replay what it accepts.
func FuzzDecodeRecord(f *testing.F) {
	f.Add("done ab x 1 1    ", "201", "\x01\x0cContent-Type\x10application/json", []byte(`{"id":1}`))
	f.Add("done ab x 1 1    ", "303", "", []byte{})
	f.Add("big", "2x1", "broken", []byte{0xff})
	f.Fuzz(func(t *testing.T, meta, code, head string, body []byte) {
		text := meta + "\n" + code + " " + strconv.Itoa(len(head)) + "\n" + head + string(body)
		decodeRecord(string(body)) // any text: no panic
		rec, err := decodeRecord(text)
		if err != nil {
			return
		}
		if rec.status < 100 || rec.status > 999 {
			t.Fatalf("accepted status %d", rec.status)
		}
		if bytes.IndexByte([]byte(meta), '\n') < 0 && !bytes.Equal(rec.body, body) {
			t.Fatalf("decoded body differs")
		}
		w := httptest.NewRecorder()
		rec.write(w, nil, &config{}, false)
		if !bytes.Equal(w.Body.Bytes(), rec.body) {
			t.Fatalf("replayed body differs")
		}
	})
}
