package idempotency

import (
	"context"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"iter"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The operator's view of keys: what cmd/idemctl uses to find keys left
// interrupted (their instance stopped after claiming them and before
// storing an answer) and to settle them. Without an outcome store such a
// key is answered 409 interrupted for its record's whole TTL, because
// only a person can find out whether the request took effect.

var (
	//go:embed lua/inspect.lua
	inspectSource string
	//go:embed lua/settle.lua
	settleSource string

	inspectScript = redis.NewScript(inspectSource)
	settleScript  = redis.NewScript(settleSource)
)

// ErrNotInterrupted is returned by Resolve and Forget for a key that is not
// interrupted (it has no record, its answer is stored, or its executor
// holds its lock); they have changed nothing.
var ErrNotInterrupted = errors.New("idempotency: key is not interrupted")

// KeyState is what Redis holds for one key, read in one step.
type KeyState struct {
	// Key names the key's record, as the middleware's log lines and
	// Execution.Key (an outcome store's primary key) do.
	Key string
	// State is "run" (claimed, no answer stored yet), "done" (an answer
	// is stored), "big" (executed, its answer not replayable) or "none"
	// (no record: never claimed, expired, or forgotten).
	State string
	// Interrupted: claimed, and nobody holds the lock under the value it
	// was claimed with, so no executor will store an answer. Retries are
	// answered 409 interrupted (or recovered, with an outcome store).
	Interrupted bool
	// Fingerprint is the claiming request's, in hex.
	Fingerprint string
	// Fence is the fencing token of the key's latest execution, and
	// Executions how many executions it has had.
	Fence      uint64
	Executions int64
	// Status and BodySize describe the stored answer ("done").
	Status   int
	BodySize int64
	// TTL is the record's remaining lifetime.
	TTL time.Duration
	// Owner is the lock value the latest execution claimed the key with;
	// Lock is the value the lock holds now ("" when free), for LockTTL.
	Owner, Lock string
	LockTTL     time.Duration
	// Waiting: another instance waits for the lock.
	Waiting bool
}

// Inspect reads the key named key: its record's name (KeyState.Key), or
// the name of its lock or waiters flag.
func (m *Middleware) Inspect(ctx context.Context, key string) (KeyState, error) {
	k, err := keysNamed(m.cfg.prefix, key)
	if err != nil {
		return KeyState{}, err
	}
	return m.keyState(k, inspectScript.Run(ctx, m.store.client, k.operated()))
}

// scanPage is how many keys one SCAN step looks at, and so the most a
// step's reply and its inspection carry.
const scanPage = 1000

// Interrupted yields every interrupted key under the middleware's prefix,
// read as Inspect reads it. It walks the keyspace with SCAN, on every
// master of a Cluster, a page of keys per step, so that Redis is never
// blocked for long: a key that becomes or stops being interrupted during
// the walk may be missed. Break out of the loop to stop early; an error
// ends the sequence.
func (m *Middleware) Interrupted(ctx context.Context) iter.Seq2[KeyState, error] {
	return func(yield func(KeyState, error) bool) {
		nodes, err := keyspaces(ctx, m.store.client)
		if err != nil {
			yield(KeyState{}, err)
			return
		}
		match := globEscape(m.cfg.prefix) + ":{*}:r*"
		seen := map[string]bool{} // SCAN may return a key twice
		for _, node := range nodes {
			// Once per node: each page's pipeline sends EVALSHA, and a
			// script flushed mid-walk is loaded again by the fallback in
			// inspectPage.
			if err := inspectScript.Load(ctx, node).Err(); err != nil {
				yield(KeyState{}, err)
				return
			}
			for cursor := uint64(0); ; {
				names, next, err := node.Scan(ctx, cursor, match, scanPage).Result()
				if err != nil {
					yield(KeyState{}, err)
					return
				}
				states, err := m.inspectPage(ctx, node, names)
				if err != nil {
					yield(KeyState{}, err)
					return
				}
				for _, s := range states {
					if s.Interrupted && !seen[s.Key] {
						seen[s.Key] = true
						if !yield(s, nil) {
							return
						}
					}
				}
				if cursor = next; cursor == 0 {
					break
				}
			}
		}
	}
}

// inspectPage inspects the records among names, which node holds, in one
// pipeline.
func (m *Middleware) inspectPage(ctx context.Context, node redis.UniversalClient, names []string) ([]KeyState, error) {
	var records []keys
	for _, name := range names {
		if k, err := keysNamed(m.cfg.prefix, name); err == nil && k.record == name {
			records = append(records, k)
		}
	}
	if len(records) == 0 {
		return nil, nil
	}
	cmds := make([]*redis.Cmd, len(records))
	// Errors are read per command below.
	node.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range records {
			cmds[i] = inspectScript.EvalSha(ctx, p, k.operated())
		}
		return nil
	})
	states := make([]KeyState, 0, len(records))
	for i, k := range records {
		cmd := cmds[i]
		if cmd.Err() != nil {
			// Once more through the client itself, which loads the
			// script again (a SCRIPT FLUSH) and follows a key that moved
			// to another master (a resharding).
			cmd = inspectScript.Run(ctx, m.store.client, k.operated())
		}
		s, err := m.keyState(k, cmd)
		if err != nil {
			return nil, err
		}
		states = append(states, s)
	}
	return states, nil
}

// keyspaces returns clients whose keyspaces together hold every key: each
// master of a Cluster, each shard of a Ring, otherwise client itself.
func keyspaces(ctx context.Context, client redis.UniversalClient) ([]redis.UniversalClient, error) {
	var (
		mu    sync.Mutex
		nodes []redis.UniversalClient
	)
	collect := func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		nodes = append(nodes, c)
		mu.Unlock()
		return nil
	}
	var err error
	switch c := client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, collect)
	case *redis.Ring:
		err = c.ForEachShard(ctx, collect)
	default:
		nodes = append(nodes, client)
	}
	return nodes, err
}

// globEscape quotes the characters that SCAN's MATCH reads as a pattern.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\^`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Resolve settles the interrupted key that st describes, as Inspect or
// Interrupted read it, with a's answer: stored as the key's
// record with the headers this middleware stores, it is replayed to every
// retry, as if the execution that was interrupted had stored it. Use it
// when that execution took effect and its answer is known (an outcome
// store committed it; cmd/idemctl reads it from sqlidem).
//
// a.Fingerprint, in hex, must be the fingerprint of the request that
// claimed the key, or empty to keep it. The record keeps its remaining
// TTL. When the key is no longer interrupted by the claim st saw (it has
// an answer, its executor holds the lock, or it was claimed anew since),
// Resolve returns an error wrapping ErrNotInterrupted, and when a is
// another request's answer one wrapping ErrKeyReused; then nothing has
// changed. An answer larger than WithMaxResponseBytes, or one marked
// NotReplayable, settles the key as executed and not replayable (409
// not-replayable), as a handler's would.
// Once settled, the key is no longer the interrupted execution's: should
// its executor only have stalled, it finds that when it wakes and stores
// nothing. A Resolve that Redis ran but whose reply was lost and resent
// reports success.
func (m *Middleware) Resolve(ctx context.Context, st KeyState, a Answer) error {
	if a.Status < 100 || a.Status > 999 {
		return fmt.Errorf("idempotency: %d is not an HTTP status", a.Status)
	}
	var fp []byte
	if a.Fingerprint != "" {
		b, err := hex.DecodeString(a.Fingerprint)
		if err != nil || len(b) != len(fingerprintSum{}) {
			return fmt.Errorf("idempotency: fingerprint %q is not %d bytes in hex", a.Fingerprint, len(fingerprintSum{}))
		}
		fp = b
	}
	rec, state := m.recordOf(a), "done"
	if a.NotReplayable || len(rec.body) > m.cfg.maxResponse {
		// As for a handler's answer over the limit: executed, and answered
		// not-replayable rather than replayed in part or beyond the bound.
		rec, state = newRecord(rec.status, nil, nil), "big"
	}
	return m.settleInterrupted(ctx, st, "answer", state, strconv.Itoa(rec.status), encodeHeader(rec.header), rec.body, fp)
}

// Forget settles the interrupted key that st describes by deleting its
// record, so that a
// retry runs the handler again: for when the execution that was
// interrupted had no effect, or its effect was undone. A token-mode key's
// token stays spent; its retry is answered token-not-found and asks for a
// new token. When the key is no longer interrupted by the claim st saw,
// Forget returns an error wrapping ErrNotInterrupted and has changed
// nothing. Should the interrupted executor only have stalled, and store
// its answer after all before a retry ran again, that answer is the key's.
func (m *Middleware) Forget(ctx context.Context, st KeyState) error {
	return m.settleInterrupted(ctx, st, "forget")
}

// settleInterrupted runs settle.lua on the key st describes, for the claim
// st saw: a key claimed anew since may be running, stalled past its lease.
func (m *Middleware) settleInterrupted(ctx context.Context, st KeyState, mode string, answer ...any) error {
	k, err := keysNamed(m.cfg.prefix, st.Key)
	if err != nil {
		return err
	}
	if !st.Interrupted || st.Owner == "" {
		return fmt.Errorf("%w: %s was not interrupted when it was inspected", ErrNotInterrupted, k.record)
	}
	args := append([]any{mode, st.Owner, m.store.recordTTL}, answer...)
	reply, err := settleScript.Run(ctx, m.store.client, k.operated(), args...).Text()
	if err != nil {
		return err
	}
	switch reply {
	case "settled":
		return nil
	case "none":
		return fmt.Errorf("%w: %s has no record (never claimed, expired, or forgotten)", ErrNotInterrupted, k.record)
	case "done":
		return fmt.Errorf("%w: %s has a stored answer", ErrNotInterrupted, k.record)
	case "big":
		return fmt.Errorf("%w: %s was executed, and its answer was not replayable", ErrNotInterrupted, k.record)
	case "running":
		return fmt.Errorf("%w: %s is running: its executor holds the lock", ErrNotInterrupted, k.record)
	case "changed":
		return fmt.Errorf("%w: %s was claimed anew since it was inspected", ErrNotInterrupted, k.record)
	case "mismatch":
		return fmt.Errorf("%w: the answer is not for the request that claimed %s (fingerprints differ)", ErrKeyReused, k.record)
	}
	return fmt.Errorf("idempotency: unexpected settle reply %q", reply)
}

// operated lists the keys the operator's scripts read: record, lock and
// waiters flag.
func (k keys) operated() []string { return []string{k.record, k.lock, k.waiters()} }

// keysNamed returns the keys of the record that name belongs to: the
// record's own name, its lock's or its waiters flag's (see keys.go).
func keysNamed(prefix, name string) (keys, error) {
	bad := fmt.Errorf("idempotency: %q names no record, lock or waiters flag under the key prefix %q", name, prefix)
	rest, ok := strings.CutPrefix(name, prefix+":{")
	end := strings.Index(rest, "}:")
	if !ok || end < 2 {
		return keys{}, bad
	}
	tag, kind := name[:len(name)-len(rest)+end+2], rest[0]
	rest, waiters := strings.CutSuffix(rest[end+2:], ":w")
	switch kind {
	case 'k':
		if rest == "r" || (rest == "l" && !waiters) {
			return keys{record: tag + "r", lock: tag + "l"}, nil
		}
	case 't':
		role, token, _ := strings.Cut(rest, ":")
		if token != "" && !strings.Contains(token, ":") && (role == "r" || (role == "l" && !waiters)) {
			return keys{record: tag + "r:" + token, lock: tag + "l:" + token, token: token}, nil
		}
	}
	return keys{}, bad
}

// keyState reads inspect.lua's reply.
func (m *Middleware) keyState(k keys, cmd *redis.Cmd) (KeyState, error) {
	r, err := cmd.Slice()
	if err != nil {
		return KeyState{}, err
	}
	if len(r) != 11 {
		return KeyState{}, fmt.Errorf("idempotency: unexpected inspect reply of %d values", len(r))
	}
	text := func(i int) string { s, _ := r[i].(string); return s }
	number := func(i int) int64 { n, _ := r[i].(int64); return n }
	s := KeyState{
		Key: k.record, State: text(0), Owner: text(1),
		Fingerprint: hex.EncodeToString([]byte(text(2))),
		BodySize:    number(6), TTL: remaining(number(7)),
		Lock: text(8), LockTTL: remaining(number(9)), Waiting: number(10) == 1,
	}
	if s.State == "" || s.State == "forgotten" {
		s.State = "none"
	}
	s.Status, _ = strconv.Atoi(text(3))
	s.Executions, _ = strconv.ParseInt(text(4), 10, 64)
	s.Fence, _ = strconv.ParseUint(text(5), 10, 64)
	s.Interrupted = s.State == "run" && s.Lock != s.Owner
	return s, nil
}

// remaining turns a PTTL reply into a duration: 0 for a missing key, and
// negative for a key without a TTL (which the middleware never leaves).
func remaining(pttl int64) time.Duration {
	switch {
	case pttl == -2:
		return 0
	case pttl < 0:
		return -1
	}
	return time.Duration(pttl) * time.Millisecond
}
