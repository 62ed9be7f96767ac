package idempotency

// testLock is a fresh lock value for a test's own claim: store.claim takes
// the key's lock under it (claim.lua), as a request's lease does.
type testLock string

func newTestLock() (testLock, error) {
	return testLock(newLockValue()), nil
}

// Value is the lock value, which the scripts check.
func (l testLock) Value() string { return string(l) }
