// Package storetest is the conformance kit of the middleware's stores:
// every promise a user relies on, checked through the public API only,
// against whatever store a Keyspace opens. Redis (idempotency.New) and
// SQL (idempotency.NewSQL) run the same kit, so a promise one keeps and
// the other breaks shows as the same subtest failing on one of them.
//
//	storetest.Run(t, func(t *testing.T) storetest.Keyspace {
//		prefix := "conformance-" + t.Name() // a keyspace of its own
//		return func(opts ...idempotency.Option) *idempotency.Middleware {
//			return idempotency.New(rdb, append([]idempotency.Option{idempotency.WithKeyPrefix(prefix)}, opts...)...)
//		}
//	})
//
// Each promise opens the instances it needs (several calls of the
// Keyspace: several instances of one service), serves them on loopback
// (httptest.NewServer), and asserts what a client sees: status, body,
// headers, Idempotent-Replayed, problem types; and how many times the
// handler or function ran, counted with atomics. Nothing passes or fails
// by timing: waits are bounded, and a slow machine only makes them last.
package storetest

import (
	"testing"

	"github.com/onceonly/idempotency"
)

// A Keyspace opens middlewares that share one store's keyspace: each call is another instance of one service.
type Keyspace func(opts ...idempotency.Option) *idempotency.Middleware

// Run runs every promise of the kit, each as a subtest; open gives each subtest a fresh, empty keyspace.
func Run(t *testing.T, open func(t *testing.T) Keyspace) {
	for _, p := range promises {
		t.Run(p.name, func(t *testing.T) { p.check(t, open(t)) })
	}
}

// A promise is one behaviour of the middleware that its users rely on,
// whatever store keeps the keys.
type promise struct {
	name  string
	check func(t *testing.T, ks Keyspace)
}

var promises = []promise{
	{"KeyRunsOnceUnderConcurrentDuplicates/SharedKeys", concurrentDuplicatesShared},
	{"KeyRunsOnceUnderConcurrentDuplicates/CallerCredentials", concurrentDuplicatesCredentials},
	{"KeyReplayedByAnotherInstance", replayedByAnotherInstance},
	{"KeyReusedForAnotherBodyIsRefused", reusedKeyRefused},
	{"KeyErrorStoredByDefault", errorStoredByDefault},
	{"KeyReleasedAnswerRunsAgain", releasedAnswerRunsAgain},
	{"KeyDuplicateWaitsForTheRunningFirst", duplicateWaits},
	{"KeyDuplicatePastTheWaitIsInProgress", duplicatePastTheWait},
	{"KeyCutOffRunIsKeptThenTakenOver", cutOffRunKept},
	{"KeyPanicBeforeWritingReleases", panicReleases},
	{"TokenSpentOnceAndReplayed", tokenSpentOnce},
	{"TokenKeysThatDifferAreLogged", tokenKeysThatDifferAreLogged},
	{"DoRunsOncePerKey", doRunsOnce},
	{"ResumeSkipsJournaledStep/Do", resumeDo},
	{"ResumeSkipsJournaledStep/Handler", resumeHandler},
	{"Ready", ready},
}
