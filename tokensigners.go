package idempotency

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Instances that sign with different keys refuse each other's tokens as
// unknown: a form served by one and submitted to another fails. That is a
// configuration mistake (WithTokenKeys differs, or is missing and each
// process drew its own key), and it is told once, at start-up, rather
// than per request.
//
// So a Middleware that deals in tokens names its signing key in its store
// by a fingerprint (never the key), in the book PREFIX:token-signers (a
// signerBook: a sorted set in Redis, a row in SQL). It does so at its
// first Protect or IssueToken, and again at most once per signersEvery
// while it issues tokens, in the background. The first time, it also reads
// which keys signed within the token TTL (their tokens may still be out):
// one its own ring does not hold is logged, once. Nothing of this is on a
// request's way: a store that does not answer costs a debug line.

// signersEvery is how often a signing instance renews its entry.
const signersEvery = time.Minute

// signerWatch announces a Middleware's signing key and checks the others'.
type signerWatch struct {
	m       *Middleware
	start   sync.Once
	last    atomic.Int64  // Unix nanoseconds of the last announcement
	checked chan struct{} // closed once the start-up check ended
}

// started runs the start-up announcement and check once, and warns about
// a random key.
func (w *signerWatch) started() {
	w.start.Do(func() {
		m := w.m
		if !m.cfg.tokenKeysSet {
			m.cfg.logger.Warn("idempotency: no token keys are configured (WithTokenKeys), so this process signs " +
				"tokens with a random key of its own: other instances refuse its tokens as unknown, and so does " +
				"this one after a restart, even a spent token's resubmission (whose form then orders again). " +
				"Give every instance the same WithTokenKeys")
		}
		w.last.Store(time.Now().UnixNano())
		w.checked = make(chan struct{})
		go func() {
			defer close(w.checked)
			w.announce(true)
		}()
	})
}

// signed renews the announcement, at most once per signersEvery.
func (w *signerWatch) signed() {
	w.started()
	last := w.last.Load()
	if time.Since(time.Unix(0, last)) >= signersEvery && w.last.CompareAndSwap(last, time.Now().UnixNano()) {
		go w.announce(false)
	}
}

// announce writes this instance's entry, drops those too old to matter,
// and, when check is set, logs the keys of others that this ring lacks.
func (w *signerWatch) announce(check bool) {
	m := w.m
	book, ok := m.keyStore.(signerBook)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.storeTimeout)
	defer cancel()
	now := time.Now()
	others, err := book.signers(ctx, signerEntry{
		name:   m.cfg.prefix + ":token-signers",
		id:     keyID(m.tokens.keys.Sign, m.cfg.prefix),
		now:    now,
		recent: now.Add(-m.cfg.tokenTTL),
		keep:   m.cfg.tokenTTL + signersEvery,
		check:  check,
	})
	if err != nil {
		m.cfg.logger.Debug("idempotency: could not name this instance's token key in "+m.outage.store+"; "+
			"instances that sign with different keys go unnoticed", "error", err)
		return
	}
	if !check {
		return
	}
	known := m.tokens.keys.ids(m.cfg.prefix)
	foreign := slices.DeleteFunc(others, func(id string) bool { return slices.Contains(known, id) })
	if len(foreign) > 0 {
		m.cfg.logger.Error("idempotency: tokens for this key prefix were signed within the token TTL by "+
			strconv.Itoa(len(foreign))+" key(s) this instance's ring lacks (another instance, or this process "+
			"before a restart, with other WithTokenKeys or none); it refuses their tokens as unknown (422). "+
			"Give every instance the same WithTokenKeys", "prefix", m.cfg.prefix, "keys", foreign)
	}
}

// A signerBook keeps the instances' signing-key entries: a sorted set in
// Redis, a row of the keys table in SQL.
type signerBook interface {
	// signers writes e's entry, drops the entries older than e.recent,
	// and keeps the book for e.keep; with e.check, it first returns the
	// keys that signed since e.recent.
	signers(ctx context.Context, e signerEntry) ([]string, error)
}

// signerEntry is one instance's announcement of its signing key.
type signerEntry struct {
	name        string // the book's key or row: PREFIX:token-signers
	id          string // keyID of the signing key
	now, recent time.Time
	keep        time.Duration
	check       bool
}

// signers on Redis: PREFIX:token-signers, a sorted set scored by when
// each key last signed, in Unix milliseconds, in one pipeline.
func (s *redisStore) signers(ctx context.Context, e signerEntry) ([]string, error) {
	var others *redis.StringSliceCmd
	_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		if e.check {
			others = p.ZRangeByScore(ctx, e.name, &redis.ZRangeBy{Min: unixMilli(e.recent), Max: "+inf"})
		}
		p.ZAdd(ctx, e.name, redis.Z{Score: float64(e.now.UnixMilli()), Member: e.id})
		p.ZRemRangeByScore(ctx, e.name, "-inf", "("+unixMilli(e.recent))
		p.PExpire(ctx, e.name, e.keep)
		return nil
	})
	if err != nil || !e.check {
		return nil, err
	}
	return others.Val(), nil
}

// signers on SQL: the row PREFIX:token-signers, whose record column holds
// a line "ID MILLISECONDS" per key, in one transaction. No key's row has
// that id, and the operator's walk passes it by; it expires as a record
// does, and the purge deletes it.
func (s *sqlStore) signers(ctx context.Context, e signerEntry) ([]string, error) {
	var others []string
	err := s.withRow(ctx, s.db, e.name, func(r *keyRow) {
		signed := map[string]int64{}
		for line := range strings.Lines(r.record) {
			id, at, ok := strings.Cut(strings.TrimSuffix(line, "\n"), " ")
			ms, err := strconv.ParseInt(at, 10, 64)
			if ok && err == nil && ms >= e.recent.UnixMilli() {
				signed[id] = max(signed[id], ms)
			}
		}
		if e.check {
			others = slices.Sorted(maps.Keys(signed))
		}
		signed[e.id] = e.now.UnixMilli()
		var book strings.Builder
		for _, id := range slices.Sorted(maps.Keys(signed)) {
			book.WriteString(id + " " + strconv.FormatInt(signed[id], 10) + "\n")
		}
		r.setRecord(book.String(), r.now+e.keep.Microseconds())
	})
	return others, err
}

// keyID names a key without revealing it: 8 bytes of an HMAC under the
// key, bound to the prefix, in hex.
func keyID(key []byte, prefix string) string {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte("idempotency/key-id\x00"))
	mac.Write([]byte(prefix))
	return hex.EncodeToString(mac.Sum(nil)[:8])
}

// ids are the names of every key of the ring.
func (k TokenKeys) ids(prefix string) []string {
	ids := []string{keyID(k.Sign, prefix)}
	for _, key := range slices.Concat(k.Accept, k.Revoked) {
		ids = append(ids, keyID(key, prefix))
	}
	return ids
}

func unixMilli(t time.Time) string {
	return strconv.FormatInt(t.UnixMilli(), 10)
}
