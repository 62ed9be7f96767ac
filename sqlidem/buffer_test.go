package sqlidem

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
)

// Past its limit a buffer keeps the answer on disk, marks it not
// replayable, and still sends it whole.
func TestBufferSpillsPastTheLimit(t *testing.T) {
	b := newBuffer(10)
	defer b.close()
	b.Header().Set("Location", "/big")
	b.WriteHeader(http.StatusCreated)
	want := bytes.Repeat([]byte("0123456789abcdef"), 64)
	for i := 0; i < len(want); i += 7 {
		b.Write(want[i:min(i+7, len(want))])
	}
	if b.body.Len() > 10 {
		t.Fatalf("%d bytes held in memory past a limit of 10", b.body.Len())
	}
	if a := b.answer(); !a.NotReplayable || a.Status != 201 || a.Body != nil || a.Header != nil {
		t.Fatalf("answer over the limit: %+v; want its status alone, not replayable", a)
	}
	w := httptest.NewRecorder()
	b.writeTo(w)
	if w.Code != 201 || !bytes.Equal(w.Body.Bytes(), want) || w.Header().Get("Location") != "/big" {
		t.Fatalf("sent %d %q (%d bytes); want the whole answer", w.Code, w.Header(), w.Body.Len())
	}

	small := newBuffer(10)
	small.Write([]byte("0123456789"))
	if a := small.answer(); a.NotReplayable || string(a.Body) != "0123456789" || small.spill != nil {
		t.Fatalf("answer at the limit: %+v", a)
	}
}
