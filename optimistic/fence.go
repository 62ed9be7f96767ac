package optimistic

import (
	"context"
	_ "embed"
	"fmt"
	"math"
	"strconv"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed fence.lua
	fenceSource string
	fenceScript = redis.NewScript(fenceSource)
)

// FencedUpdate writes set to the row id only if the row's fence is not
// above token, and stores token as its fence in the same statement:
//
//	UPDATE name SET set…, fence = ? WHERE id = ? AND fence <= ?
//
// token is the writer's fencing token, idempotency.FencingToken(ctx) inside
// a protected handler. An executor whose lease ran out while another took
// its key over carries a lower token than the one that took over, so once
// the newer executor has written, the older one's write is refused: the
// error is a *StaleFenceError matching ErrStaleFence. A token equal to the
// stored one is accepted: only the same execution holds it, so one execution
// may write a row several times.
//
// A stale write fails under every isolation level, inside a transaction
// (db a *sql.Tx) and outside one. Mostly it fails with ErrStaleFence; on
// PostgreSQL at REPEATABLE READ or SERIALIZABLE, and on SQLite in a
// DEFERRED transaction, when the row changed after the transaction's
// snapshot, the database refuses the UPDATE itself before the tokens can be
// compared (SQLSTATE 40001, SQLITE_BUSY_SNAPSHOT): the error wraps the
// driver's, the transaction cannot commit, and run again from BEGIN the
// write fails with ErrStaleFence. Either way the caller's transaction must
// roll back. In a SQLite transaction that took the write lock at BEGIN
// (IMMEDIATE), no newer write can land while it is open.
//
// A missing row is not created: the error matches ErrNotFound. token 0
// (no protected execution) fails with ErrNoFencingToken, and a token above
// math.MaxInt64 does not fit a BIGINT and fails as well. set must not name
// the id, fence or version column: the version is Update's to keep, and a
// write that set it back could let a reader's stale compare-and-set
// through.
func (t Table) FencedUpdate(ctx context.Context, db Querier, id any, token uint64, set ...Assignment) error {
	if token == 0 {
		return ErrNoFencingToken
	}
	if token > math.MaxInt64 {
		return fmt.Errorf("optimistic: %s: fencing token %d does not fit a BIGINT", t.Name, token)
	}
	q, err := t.quoted()
	if err != nil {
		return err
	}
	store := func(s *statement) string { return q.fence + " = " + s.param(int64(token)) }
	below := func(s *statement) string { return "COALESCE(" + q.fence + ", 0) <= " + s.param(int64(token)) }
	s, err := q.update(id, set, []string{q.raw.ID, q.raw.Fence, q.raw.Version}, store, below)
	if err != nil {
		return err
	}
	n, err := exec(ctx, db, s)
	switch {
	case err != nil:
		return fmt.Errorf("optimistic: fenced update of %s: %w", q.resource(id), err)
	case n == 1:
		return nil
	case n > 1:
		return fmt.Errorf("optimistic: fenced update of %s changed %d rows; %s must be unique", q.resource(id), n, q.raw.ID)
	}
	// Why did the UPDATE change nothing? MySQL's UPDATE matched against the
	// latest committed row, so the fence must be read as of then too: a
	// plain read inside a REPEATABLE READ transaction would see the
	// snapshot, which may still hold this execution's own token while a
	// newer one has written since, and the stale write would pass for "the
	// same values again".
	current, found, err := q.current(ctx, db, q.fence, id, true)
	switch {
	case err != nil:
		return fmt.Errorf("optimistic: fenced update of %s changed nothing, and reading its fence failed: %w", q.resource(id), err)
	case !found:
		return fmt.Errorf("%w: %s", ErrNotFound, q.resource(id))
	case current == int64(token):
		// The row matched and already held these values: MySQL counts
		// changed rows, not matched ones, unless the DSN asks for found rows.
		return nil
	}
	return &StaleFenceError{Resource: q.resource(id), Token: token, Current: uint64(max(current, 0))}
}

// FencedSet writes fields to the hash at key only if the hash's fence field
// is not above token (a missing hash or field counts as 0), and stores token
// there, atomically in one script. A missing hash is created. A stale token
// gets a *StaleFenceError matching ErrStaleFence, and nothing is written.
// As with FencedUpdate, a token equal to the stored one is accepted, and
// token 0 fails with ErrNoFencingToken. Tokens are compared exactly over the
// whole uint64 range.
//
// fields must not name the fence field or the version field (see
// FencedUpdate). The call touches one key, so it works on Redis Cluster.
func (h Hash) FencedSet(ctx context.Context, rdb redis.Scripter, key string, token uint64, fields map[string]any) error {
	if token == 0 {
		return ErrNoFencingToken
	}
	ff := h.fenceField()
	args, err := fieldArgs(key, fields, ff, strconv.FormatUint(token, 10), h.versionField())
	if err != nil {
		return err
	}
	reply, err := fenceScript.Run(ctx, rdb, []string{key}, args...).Slice()
	if err != nil {
		return fmt.Errorf("optimistic: fenced write of hash %s: %w", key, err)
	}
	if ok, _ := reply[0].(int64); ok == 1 {
		return nil
	}
	text, _ := reply[1].(string)
	current, err := strconv.ParseUint(text, 10, 64)
	if err != nil {
		return fmt.Errorf("optimistic: hash %s: fence field %q holds %q", key, ff, text)
	}
	return &StaleFenceError{Resource: "hash " + key, Token: token, Current: current}
}
