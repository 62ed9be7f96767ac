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
// otherwise.
//
//	idem := idempotency.New(rdb)
//	r := chi.NewRouter()
//	r.Get("/idempotency/token", idem.TokenHandler().ServeHTTP)
//	r.With(idem.Protect).Post("/orders", createOrder)
//	r.With(idem.ProtectKey).Post("/payments", createPayment)
//
// The same protocol runs functions without HTTP: Do runs a function at most
// once per Key (a queue message's id, a job's) and gives every duplicate the
// stored result. Transport is the client side: an http.RoundTripper that
// sends one Idempotency-Key with every retry of a request.
//
// Every rejection is answered by the error handler (DefaultErrorHandler
// writes RFC 9457 problem+json); the errors it receives match the package's
// sentinel errors with errors.Is.
package idempotency
