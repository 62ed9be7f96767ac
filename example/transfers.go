package main

import (
	"github.com/go-chi/chi/v5"
	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/example/internal/bank"
)

// registerTransfers serves account transfers, whose balances live in SQL:
//
//	POST /transfers  {"from":"alice","to":"bob","amount":2500}, key mode
//	GET  /accounts   every balance
//
// The route has a middleware of its own, with the bank's outcome store: a
// transfer commits its answer with its writes, so an execution abandoned by
// a dead instance is recovered from SQL (the committed answer replayed, or
// the transfer run again when nothing committed) rather than answered 409
// interrupted. That is only safe for handlers that write nothing outside
// the transaction, which is why the other routes keep theirs.
func registerTransfers(r chi.Router, back backend, b *bank.Bank) *idempotency.Middleware {
	transfers := back.protection(idempotency.WithCallerCredentials(), idempotency.WithOutcomeStore(b.Outcomes()),
		idempotency.WithFingerprint(idempotency.CanonicalJSON))
	r.With(transfers.ProtectKey).Post("/transfers", b.Outcomes().Handler(b.Transfer).ServeHTTP)
	r.Get("/accounts", b.ListAccounts)
	return transfers
}
