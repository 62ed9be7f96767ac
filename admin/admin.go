// Package admin is the operator's view of a middleware's keys: it finds
// keys left interrupted (their instance stopped after claiming them and
// before storing an answer) and settles them. Without an outcome store such
// a key is answered 409 interrupted for its record's whole TTL, because
// only a person can find out whether the request took effect; cmd/idemctl
// is a command over this package. It reads and settles the keys where the
// middleware keeps them: in Redis (idempotency.New), or in its SQL table
// (idempotency.NewSQL), with the same rules.
//
//	ops := admin.New(idem) // idem is the *idempotency.Middleware of the routes
//	for st, err := range ops.Interrupted(ctx) {
//		if err != nil {
//			return err
//		}
//		fmt.Println(st.Key, st.Fence, st.TTL) // then ops.Resolve or ops.Forget
//	}
package admin

import (
	"context"
	"iter"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/keyspace"
)

// ErrNotInterrupted is returned by Resolve and Forget for a key that is not
// interrupted by the claim they were given (it has no record or a
// forgotten one, its answer is stored, its executor holds its lock or may
// still store its answer, or it was claimed anew); they have changed
// nothing.
var ErrNotInterrupted = keyspace.ErrNotInterrupted

// KeyState is what Redis or the SQL table holds for one key, read in one
// step: the key's
// record name (Key), its state ("run", "done", "big", "none", or "corrupt"
// for a record it cannot read), whether it is Interrupted, the claiming
// request's Fingerprint, its Fence and Executions, the stored answer's
// Status and BodySize, the record's TTL, the Owner it was claimed under
// and the Lock held now (in SQL, the row's lease), with its LockTTL, and
// whether another instance is Waiting (never, in SQL: waiters poll). Each
// field is documented on keyspace.State, which it names.
type KeyState = keyspace.State

// An Operator reads and settles the keys of one middleware: its Redis
// client or its database and table, key prefix, record TTL, response
// limit and replay headers.
type Operator struct {
	store *keyspace.Store
}

// New returns the Operator of m's keys. m is configured as the middleware
// that protects the routes is (at least its client, or its database, SQL
// dialect and WithSQLTable, and WithKeyPrefix, WithRecordTTL,
// WithMaxResponseBytes and WithReplayHeaders, and WithExecutionTimeout,
// WithLockLease and WithStoreTimeout, which set the claim horizon: a key
// whose lock lapsed is not interrupted until that long after its claim,
// since its executor may be live and still store its answer); it need
// not be the same value.
func New(m *idempotency.Middleware) *Operator {
	return &Operator{store: keyspace.StoreOf(m)}
}

// Inspect reads the key named key: its record's name (KeyState.Key, which
// is also the id of its row in SQL), or the name of its lock or waiters
// flag.
func (o *Operator) Inspect(ctx context.Context, key string) (KeyState, error) {
	return o.store.Inspect(ctx, key)
}

// Interrupted yields every interrupted key under the middleware's prefix,
// read as Inspect reads it. It walks the keyspace with SCAN, on every
// master of a Cluster, a page of keys per step, so that Redis is never
// blocked for long; in SQL it reads the table a page of rows per step, in
// the order of their ids, and locks none. Either way a key that becomes
// or stops being interrupted during the walk may be missed. Break out of
// the loop to stop early; an error ends the sequence.
func (o *Operator) Interrupted(ctx context.Context) iter.Seq2[KeyState, error] {
	return o.store.Interrupted(ctx)
}

// Resolve settles the interrupted key that st describes, as Inspect or
// Interrupted read it, with a's answer: stored as the key's record with
// the headers the middleware stores, it is replayed to every retry, as if
// the execution that was interrupted had stored it. Use it when that
// execution took effect and its answer is known (an outcome store
// committed it; cmd/idemctl reads it from sqlidem).
//
// a.Fingerprint, in hex, must be the fingerprint of the request that
// claimed the key, or empty to keep it. The record keeps its remaining
// TTL. When the key is no longer interrupted by the claim st saw (it has
// an answer, its executor holds the lock, or it was claimed anew since),
// Resolve returns an error wrapping ErrNotInterrupted, and when a is
// another request's answer one wrapping idempotency.ErrKeyReused; then
// nothing has changed. An answer larger than WithMaxResponseBytes, or one
// marked NotReplayable, settles the key as executed and not replayable
// (409 not-replayable), as a handler's would. Once settled, the key is no
// longer the interrupted execution's: should its executor only have
// stalled, it finds that when it wakes and stores nothing.
//
// Resolve with the same st and a again, while the record is the one it
// stored (go-redis resending a Resolve whose reply was lost, or a commit
// whose reply the database's connection lost, say), reports success. Nothing else that finds the key settled does: a Resolve of a
// key already resolved with another answer, or forgotten, returns an error
// wrapping ErrNotInterrupted, since the key does not replay a.
//
// a.Status must be a final answer's, 200 to 999: a 1xx status is refused
// (net/http would replay 103 as a 200, and 101 as a switch of protocols).
func (o *Operator) Resolve(ctx context.Context, st KeyState, a idempotency.Answer) error {
	return o.store.Resolve(ctx, st, a.Status, a.Header, a.Body, a.Fingerprint, a.NotReplayable)
}

// Forget settles the interrupted key that st describes by deleting its
// record, so that a retry runs the handler again: for when the execution
// that was interrupted had no effect, or its effect was undone. A
// token-mode key's token stays spent; its retry is answered
// token-not-found and asks for a new token. When the key is no longer
// interrupted by the claim st saw (it has an answer, a resolved one
// included, its executor holds the lock, or a retry claimed it anew since
// it was forgotten), Forget returns an error wrapping ErrNotInterrupted
// and has changed nothing. Forget with the same st again, while the record
// is still the one it forgot (a Forget sent again after its reply was
// lost, say), reports success. Should the interrupted executor only have
// stalled, and store its answer after all before a retry ran again, that
// answer is the key's.
func (o *Operator) Forget(ctx context.Context, st KeyState) error {
	return o.store.Forget(ctx, st)
}
