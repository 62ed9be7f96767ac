// Package idempotency makes non-idempotent HTTP endpoints safe to call twice.
//
// A Middleware protects chosen routes. In token mode it issues one-time
// tokens bound to the caller's session (TokenHandler, FormField) and each
// protected request must spend one; in key mode the client supplies an
// Idempotency-Key, as Stripe's API and message-queue callbacks do. Either
// way the first request takes a short Redis lock, claims the token or key
// atomically, runs the handler once while recording its response, and stores
// that response; every duplicate gets the stored response back with the
// header Idempotent-Replayed: true. A duplicate that arrives while the first
// still runs waits for it, a reused key with a different request is refused,
// and when Redis is unreachable nothing runs (503) unless WithFailOpen says
// otherwise. Key mode must be told who its callers are, or one caller's
// stored answer could reach another (WithCallerCredentials, WithScope,
// WithSharedKeys; ProtectKey panics without one).
//
//	idem := idempotency.New(rdb, idempotency.WithCallerCredentials())
//	r := chi.NewRouter()
//	r.Get("/idempotency/token", idem.TokenHandler().ServeHTTP)
//	r.With(idem.Protect).Post("/orders", createOrder)
//	r.With(idem.ProtectKey).Post("/payments", createPayment)
//
// The same protocol runs functions without HTTP: Do runs a function at most
// once per Key (a queue message's id, a job's) and gives every duplicate the
// stored result.
//
// A run that dies mid-way (its instance crashed) can be resumed instead of
// answered 409 interrupted: with WithResume (or Do's Resumable) the next
// retry takes it over and runs it again from the top, and each Step the
// dead run journaled returns its result without running again.
//
//	charge, err := idempotency.Step(ctx, "charge", func(ctx context.Context) (Receipt, error) {
//		return provider.Charge(ctx, idempotency.StepKey(ctx, "charge"), amount)
//	})
//
// Every rejection is answered by the error handler (DefaultErrorHandler
// writes RFC 9457 problem+json); the errors it receives match the package's
// sentinel errors with errors.Is.
//
// # Packages
//
// This package holds the protocol. What a user imports separately lives
// beside it, each importing only what it needs:
//
//	client       Transport, the client side: one Idempotency-Key across
//	             retries; it imports no Redis
//	cloudevents  Key and Scope, the extractors for CloudEvents over HTTP
//	admin        Operator: Inspect, Interrupted, Resolve and Forget, the
//	             operator's view of interrupted keys (cmd/idemctl)
//	storetest    Run: the conformance kit that every store's tests run,
//	             the HTTP contract through the public API
//
// They never change: client imports no Redis, and a program that imports
// only this package (every HTTP user) compiles no gRPC, OpenTelemetry or
// SQL driver; admin and cloudevents import this package and nothing
// beyond it. doc_test.go checks it with go list -deps.
//
// # Code map
//
// Each concept, and the file that holds it. A request's way through
// follows the order of the list; HTTP (handler.go) and Do (do.go) are two
// adapters over one lifecycle (lifecycle.go).
//
//	middleware.go    New, Middleware, Protect, ProtectKey, KeyHeader
//	options.go       Option and every With option, their defaults and checks
//	errors.go        the sentinel errors, their problem types, DefaultErrorHandler
//	problempage.go   a refusal as a page, for a browser's form submission
//	token.go         TokenHandler, FormField, IssueToken: issuing tokens
//	tokenkeys.go     TokenKeys, WithTokenKeys, ParseTokenKeys: the key ring, configuration
//	tokensign.go     how an issued token is signed, and checked against the ring
//	tokensigners.go  instances that sign with different keys, found at start-up
//	tokencheck.go    which of the caller's sessions a token was issued to
//	do.go            Do and Key: the function adapter
//	codec.go         CheckResult: a result comes back exactly, or is not stored
//	handler.go       the HTTP adapter over the lifecycle
//	extract.go       KeyExtractor: HeaderKey, FormKey, JSONKey, FirstKey
//	identify.go      the key, the scope and the route a request names
//	caller.go        who sent a key-mode request: credentials, ScopeByHeader
//	body.go          reading the request body once, for the fingerprint
//	fingerprint.go   Fingerprinter: DefaultFingerprint, CanonicalJSON, JSONFields, IncludeHeaders
//	canonical.go     the canonical JSON form
//	keys.go          the Redis key names and their hash tags
//	serve.go         one request's way: cache, in-process flight, claim, run
//	verdict.go       the verdict a step reaches, written once
//	cache.go         completed answers in this process's memory
//	inflight.go      duplicates inside this process wait for the first
//	claim.go         taking the lease and claiming the key, in one script
//	waiter.go        waiting for a holder on another instance, on one shared subscription
//	replicas.go      WithReplicaAcks: WAIT for replicas before running
//	lifecycle.go     a key's life from claim to end
//	releaserule.go   the release rule: what becomes of a key when its run ends, one pure function
//	execution.go     Release, Execution, ExecutionOf: what a handler's context carries
//	step.go          Step, StepKey, Permanent: a resumable run's steps (WithResume)
//	journal.go       the steps' journal, kept in the run's record
//	policy.go        StorePolicy: which answers are stored, for how long
//	later.go         releases and stores Redis did not answer, retried
//	watchdog.go      renewing the lease while the work runs
//	recorder.go      what the handler writes, passed through and kept
//	replay.go        ReplayedHeader, stored records and their replay
//	negotiate.go     a replay under the replaying request's Accept-Encoding and Vary
//	nested.go        a route protected twice: the inner layer steps aside
//	header.go        the stored header block
//	record.go        a record as Redis holds it: one string in keyspace's one layout, read and written whole
//	keystore.go      the store port: what a key's life needs from storage
//	redisstore.go    the Redis store, one method per script in lua/
//	sqlstore.go      NewSQL, WithSQLTable: the SQL store, one transaction per operation
//	sqlrow.go        a key's row, and the Go twins of the scripts that change it
//	sqlline.go       the connection a store keeps for running keys while handlers fill the pool
//	sqlpool.go       what the SQL store reads of db's pool: full, a connection ended, an error naming it
//	sqlstatements.go the SQL store's table and statements, per dialect
//	sqlnotify.go     WithSQLListener: waiters woken by the database's notifications
//	sqltx.go         StoreAnswerInTx: a key's answer in the handler's own transaction
//	outcomestore.go  OutcomeStore, Answer: answers committed with the handler's writes
//	outcome.go       Outcome: what the middleware did with a request
//	observe.go       Event, WithObserver's reports, LogObserver
//	outage.go        Outage: protected routes refusing because Redis does not answer, for the log and the observer
//	ready.go         Ready, ReadyHandler: whether the middleware can serve now, for a readiness probe
//	operator.go      the records handed to package admin
//	fence.go         FencingToken, and the private context key type
//	costswitch.go    turning a guarantee off, in a benchmark build, to measure what it costs
//	costswitch_on.go  the benchmark build (tag idemcost)
//	costswitch_off.go every other build: the switches compile away
package idempotency
