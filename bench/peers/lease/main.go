// Command lease serves the side-by-side benchmark's trivial handler behind
// a lease-in-record middleware of github.com/repenguin22/idemlease's shape,
// written here from that library's documented behaviour (the module proxy
// does not serve it): no separate lock; the key's record is a Redis hash
// that holds a 128-bit random lease token while the handler runs, claimed
// by one script (EXISTS, else HSET and PEXPIRE to the lease) and completed
// by another that compares the token before it stores the answer; a
// SHA-256 fingerprint of the method, path, query and body; 409 with
// Retry-After while a key runs, 422 for a key reused with another request,
// problem+json errors, 503 when Redis fails (fail-closed), and a replay
// marked Idempotency-Replayed. What it does not do, and this library does:
// renew the lease while a handler runs (a handler slower than the 30 s
// lease runs twice), fence the executor, wait for a running key, cache
// answers in process, keep a key whose answer could not be stored.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/onceonly/idempotency/bench/peers/peer"
	"github.com/redis/go-redis/v9"
)

const (
	leaseTTL  = 30 * time.Second
	recordTTL = 24 * time.Hour
	maxBody   = 1 << 20
)

// ReplayedHeader marks a replayed answer, as idemlease's middleware does.
const ReplayedHeader = "Idempotency-Replayed"

func main() {
	f := peer.ParseFlags(true)
	rdb := redis.NewClient(&redis.Options{Addr: f.Redis, PoolSize: 64, ContextTimeoutEnabled: true})
	defer rdb.Close()
	peer.Serve(f, protect(&store{rdb: rdb}, peer.Handler(f.Instance)), ReplayedHeader)
}

func protect(s *store, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost && r.Method != http.MethodPatch {
			next.ServeHTTP(w, r)
			return
		}
		key := r.Header.Get("Idempotency-Key")
		if key == "" {
			next.ServeHTTP(w, r)
			return
		}
		if len(key) > 255 {
			problem(w, http.StatusBadRequest, "invalid-key")
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
		if err != nil || len(body) > maxBody {
			problem(w, http.StatusBadRequest, "unreadable-body")
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		fp := fingerprint(r, body)

		var raw [16]byte
		rand.Read(raw[:])
		token := hex.EncodeToString(raw[:])
		existing, err := s.reserve(r.Context(), key, token, fp)
		if err != nil {
			problem(w, http.StatusServiceUnavailable, "store-unavailable")
			return
		}
		if existing != nil {
			switch {
			case existing.state == stateReserved:
				w.Header().Set("Retry-After", retryAfter(existing.leaseEnds))
				problem(w, http.StatusConflict, "in-flight")
			case existing.fingerprint != fp:
				problem(w, http.StatusUnprocessableEntity, "fingerprint-mismatch")
			default:
				replay(w, existing.payload)
			}
			return
		}

		rec := &recorder{ResponseWriter: w}
		finish := context.WithoutCancel(r.Context())
		defer func() {
			if p := recover(); p != nil {
				s.release(finish, key, token)
				panic(p)
			}
		}()
		next.ServeHTTP(rec, r)
		if rec.status >= 500 || rec.overflow {
			s.release(finish, key, token)
			return
		}
		s.complete(finish, key, token, rec.payload())
	})
}

// fingerprint is SHA-256 over the method, the path, the query and the
// body, each length-prefixed, in hex.
func fingerprint(r *http.Request, body []byte) string {
	h := sha256.New()
	for _, part := range []string{r.Method, r.URL.Path, r.URL.RawQuery} {
		h.Write(strconv.AppendInt(nil, int64(len(part)), 10))
		h.Write([]byte{':'})
		h.Write([]byte(part))
	}
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

func retryAfter(leaseEnds time.Time) string {
	secs := int64((time.Until(leaseEnds) + time.Second - 1) / time.Second)
	return strconv.FormatInt(max(secs, 1), 10)
}

// problem writes an RFC 9457 problem+json error.
func problem(w http.ResponseWriter, status int, kind string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	io.WriteString(w, `{"type":"https://example.test/problems/`+kind+`","title":"`+kind+`","status":`+strconv.Itoa(status)+`}`)
}
