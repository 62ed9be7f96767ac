package client

import (
	"bytes"
	"context"
	"crypto/sha256"
	"hash"
	"io"
	"net/http"
	"sync"
)

// A resumingBody is the body of the answer RoundTrip returns for a keyed
// request. The connection may fail under it after the headers came: the
// handler ran and its answer was stored, and only the rest of the body is
// lost. A caller that sees the error would send the request again under a
// new key and run it twice, so the body resends it itself, under the same
// key, and goes on from where the failure cut it, once the replay proves
// to be the same answer: replayed, of the same status and representation
// (Content-Type, Content-Encoding, Content-Length), its first bytes the
// bytes already read (compared by their SHA-256). Whatever else comes back
// (another status, an answer not replayed, one shorter, or one encoded
// otherwise, as when a layer outside the middleware encodes each answer
// anew) leaves the failure as it came, for the caller to see. The replay's
// trailers, once its body ends, are the answer's.
type resumingBody struct {
	t        *Transport
	req      *http.Request  // the caller's, to send again
	resp     *http.Response // the answer being read, whose headers the caller has
	key      string
	attempt  int // the attempts the request has used
	attempts int
	replay   *http.Response // the answer the body goes on from, once it resumed

	read int64     // the bytes read so far
	sum  hash.Hash // their SHA-256

	mu     sync.Mutex // guards what follows: Close may come while Read resumes
	body   io.ReadCloser
	closed bool
	cancel context.CancelFunc // ends the resent requests, at Close; nil until one is sent
}

func newResumingBody(t *Transport, req *http.Request, key string, resp *http.Response, attempt, attempts int) *resumingBody {
	return &resumingBody{t: t, req: req, resp: resp, key: key,
		attempt: attempt, attempts: attempts, sum: sha256.New(), body: resp.Body}
}

func (b *resumingBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	body := b.body
	b.mu.Unlock()
	n, err := body.Read(p)
	b.sum.Write(p[:n])
	b.read += int64(n)
	if err == io.EOF && b.replay != nil {
		// net/http fills a body's trailers in once it ends.
		if b.resp.Trailer == nil {
			b.resp.Trailer = http.Header{}
		}
		for name, values := range b.replay.Trailer {
			b.resp.Trailer[name] = values
		}
	}
	if err == nil || err == io.EOF || !retryableError(err) || !b.resume() {
		return n, err
	}
	return n, nil
}

// sameAnswer reports whether resp may be the replay of the answer being
// read, by what the caller already has of it: its status and the headers
// that say how its bytes are to be read. A replay encoded otherwise (a
// layer that chose another encoding) would be read under the wrong ones,
// even before any of its bytes could be compared.
func (b *resumingBody) sameAnswer(resp *http.Response) bool {
	if resp.StatusCode != b.resp.StatusCode || resp.Header.Get(ReplayedHeader) != "true" ||
		resp.Uncompressed != b.resp.Uncompressed {
		return false
	}
	for _, name := range []string{"Content-Type", "Content-Encoding"} {
		if resp.Header.Get(name) != b.resp.Header.Get(name) {
			return false
		}
	}
	return resp.ContentLength < 0 || b.resp.ContentLength < 0 || resp.ContentLength == b.resp.ContentLength
}

// resume sends the request again under its key, for as many attempts as
// it has left, until an answer proves to be the replay of the one being
// read; that answer's body, past the bytes already read, becomes the
// body. It reports whether one did.
func (b *resumingBody) resume() bool {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return false
	}
	if b.cancel == nil {
		// The resent requests' bodies are read after Read returns, so
		// their context lives until Close, which ends it.
		var ctx context.Context
		ctx, b.cancel = context.WithCancel(b.req.Context())
		b.req = b.req.WithContext(ctx)
	}
	b.mu.Unlock()
	want := b.sum.Sum(nil)
	for b.attempt < b.attempts && b.req.Context().Err() == nil {
		resp, used, err := b.t.sendFrom(b.req, b.key, b.attempt+1, b.attempts)
		b.attempt = used
		if err != nil {
			return false // sendFrom's last word: its attempts are spent, the context ended, or it cannot pass
		}
		if !b.sameAnswer(resp) {
			resp.Body.Close()
			return false // another answer: what was read is not its beginning
		}
		again := sha256.New()
		copied, err := io.CopyN(again, resp.Body, b.read)
		switch {
		case err != nil && retryableError(err) && err != io.EOF:
			resp.Body.Close()
			continue // cut again before it came as far: one more try
		case copied != b.read || !bytes.Equal(again.Sum(nil), want):
			resp.Body.Close()
			return false
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.closed {
			resp.Body.Close()
			return false
		}
		b.body.Close()
		b.body, b.replay = resp.Body, resp
		return true
	}
	return false
}

func (b *resumingBody) Close() error {
	b.mu.Lock()
	b.closed = true
	body, cancel := b.body, b.cancel
	b.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	return body.Close()
}
