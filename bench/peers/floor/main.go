// Command floor serves the side-by-side benchmark's trivial handler behind
// the smallest middleware that keeps this library's guarantees on the
// measured paths: bsm/redislock's lock with the claim riding in its
// pipeline, a lease renewed by a timer, a fencing token from Redis's clock,
// a fingerprint check, and the answer stored and the lock released in one
// script. It is the floor the library's cost is judged against, not a
// product: no tokens, no replicas, no outcome store, no waiting for a held
// key (409 at once), no recovery of abandoned keys, one header replayed.
// Its two scripts are the fewest commands a correct claim and completion
// can run: a record is one string ("r" and the lock value while running;
// "d", the fingerprint, the status, the content type and the body once
// done).
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/bsm/redislock"
	"github.com/onceonly/idempotency/bench/peers/floor/floorlua"
	"github.com/onceonly/idempotency/bench/peers/peer"
	"github.com/redis/go-redis/v9"
)

const (
	lease     = 10 * time.Second
	recordTTL = 24*time.Hour + lease
	stepLimit = 2 * time.Second
)

func main() {
	f := peer.ParseFlags(true)
	rdb := redis.NewClient(&redis.Options{Addr: f.Redis, PoolSize: 64, ContextTimeoutEnabled: true})
	defer rdb.Close()
	m := &middleware{rdb: rdb, locks: redislock.New(ridingScripter{rdb})}
	peer.Serve(f, m.protect(peer.Handler(f.Instance)), "Idempotent-Replayed")
}

type middleware struct {
	rdb   *redis.Client
	locks *redislock.Client
}

func (m *middleware) protect(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if key == "" || len(key) > 255 || err != nil {
			http.Error(w, "bad key or body", http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		h := sha256.New()
		h.Write([]byte(r.Method + " " + r.URL.Path + "\n"))
		h.Write(body)
		fp := h.Sum(nil)
		keys := []string{"floor:{" + key + "}", "floor:{" + key + "}:lock"}

		ctx, cancel := context.WithTimeout(r.Context(), stepLimit)
		defer cancel()
		var token [16]byte
		rand.Read(token[:])
		value := base64.RawURLEncoding.EncodeToString(token[:])
		rider := &rider{keys: keys, args: []any{value, recordTTL.Milliseconds()}}
		lock, err := m.locks.Obtain(context.WithValue(ctx, riderKey{}, rider), keys[1], lease,
			&redislock.Options{Token: value})
		if rider.reply == nil || (err != nil && !errors.Is(err, redislock.ErrNotObtained)) {
			http.Error(w, "store unavailable", http.StatusServiceUnavailable)
			return
		}
		rec, _ := rider.reply.Val().(string)
		fence, _ := rider.reply.Val().(int64) // the handler would pass it to its storage
		switch {
		case len(rec) > 0 && rec[0] == 'd':
			replay(w, rec, fp)
			return
		case err != nil || rec != "r"+value && fence <= 0:
			http.Error(w, "in progress", http.StatusConflict)
			return
		}

		// The lease: renewed every third of it while the handler runs.
		var renew *time.Timer
		renew = time.AfterFunc(lease/3, func() {
			if lock.Refresh(context.Background(), lease, nil) == nil {
				renew.Reset(lease / 3)
			}
		})
		out := &recorder{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(out, r)
		renew.Stop()

		done := make([]byte, 0, 1+len(fp)+4+out.body.Len()+64)
		done = append(done, 'd')
		done = append(done, fp...)
		done = strconv.AppendInt(done, int64(out.status), 10)
		ct := w.Header().Get("Content-Type")
		done = append(done, byte(len(ct)))
		done = append(done, ct...)
		done = append(done, out.body.Bytes()...)
		ctx, cancel = context.WithTimeout(context.Background(), stepLimit)
		defer cancel()
		if err := floorlua.Complete.Run(ctx, m.rdb, keys, value, done, recordTTL.Milliseconds()).Err(); err != nil {
			http.Error(w, "answer not stored", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(out.status)
		w.Write(out.body.Bytes())
	})
}

// replay answers with a done record, when the fingerprint matches.
func replay(w http.ResponseWriter, rec string, fp []byte) {
	if len(rec) < 1+len(fp)+4 || rec[1:1+len(fp)] != string(fp) {
		http.Error(w, "key reused", http.StatusUnprocessableEntity)
		return
	}
	rest := rec[1+len(fp):]
	status, _ := strconv.Atoi(rest[:3])
	n := int(rest[3])
	w.Header().Set("Content-Type", rest[4:4+n])
	w.Header().Set("Idempotent-Replayed", "true")
	w.WriteHeader(status)
	io.WriteString(w, rest[4+n:])
}

// recorder keeps the handler's status and body until the answer is stored.
type recorder struct {
	http.ResponseWriter
	status int
	body   bytes.Buffer
}

func (r *recorder) WriteHeader(status int)      { r.status = status }
func (r *recorder) Write(b []byte) (int, error) { return r.body.Write(b) }

// A rider is the claim that goes out in one pipeline with redislock's
// obtain script, as the library does it (ride.go).
type rider struct {
	keys  []string
	args  []any
	reply *redis.Cmd
}

type riderKey struct{}

type ridingScripter struct{ *redis.Client }

func (s ridingScripter) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	if rd := pending(ctx); rd != nil {
		return s.ride(ctx, rd, "evalsha", sha, keys, args)
	}
	return s.Client.EvalSha(ctx, sha, keys, args...)
}

// Eval is redislock's way in when Redis lacked its script.
func (s ridingScripter) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	if rd := pending(ctx); rd != nil {
		return s.ride(ctx, rd, "eval", script, keys, args)
	}
	return s.Client.Eval(ctx, script, keys, args...)
}

func pending(ctx context.Context) *rider {
	rd, _ := ctx.Value(riderKey{}).(*rider)
	if rd == nil || rd.reply != nil {
		return nil
	}
	return rd
}

func (s ridingScripter) ride(ctx context.Context, rd *rider, name, script string, keys []string, args []any) *redis.Cmd {
	pipe := s.Pipeline()
	var lock *redis.Cmd
	if name == "eval" {
		lock = pipe.Eval(ctx, script, keys, args...)
	} else {
		lock = pipe.EvalSha(ctx, script, keys, args...)
	}
	rd.reply = pipe.EvalSha(ctx, floorlua.Claim.Hash(), rd.keys, rd.args...)
	pipe.Exec(ctx)
	switch {
	case isNoScript(lock.Err()):
		rd.reply = nil // the claim rides again with redislock's Eval
	case isNoScript(rd.reply.Err()):
		floorlua.Claim.Load(ctx, s.Client)
		rd.reply = floorlua.Claim.Run(ctx, s.Client, rd.keys, rd.args...)
	}
	return lock
}

func isNoScript(err error) bool { return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") }
