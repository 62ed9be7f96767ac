package idempotency

import "context"

// contextKey is a private pointer type, so no other package can read or
// overwrite the values stored under it.
type contextKey struct{ name string }

// FencingToken returns the fencing token of the protected execution that
// ctx belongs to, or 0 outside one. Tokens grow with every execution of a
// key (Redis's clock in microseconds at the claim, and always above the
// key's previous token), so storage that keeps the highest token it has
// accepted and refuses lower ones rejects a write from an executor whose
// lease ran out while another took its key over.
//
// Across different keys the tokens are only ordered by Redis's clock: fence
// data that one key owns (the payment row of that key). A row written under
// many keys would refuse a late write from an older claim, and after a
// failover to a replica whose clock runs behind, a new key's token can be
// lower than tokens already seen.
func FencingToken(ctx context.Context) uint64 {
	if e, ok := ctx.Value(executionKey).(*execution); ok {
		return e.fence
	}
	return 0
}
