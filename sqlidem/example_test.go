package sqlidem_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"log"
	"net/http"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/sqlidem"
	"github.com/redis/go-redis/v9"
)

func ExampleStore_Handler() {
	db, err := sql.Open("pgx", "postgres://localhost/shop")
	if err != nil {
		log.Fatal(err)
	}
	outcomes, err := sqlidem.New(db, sqlidem.PostgreSQL)
	if err != nil {
		log.Fatal(err)
	}
	if err := outcomes.CreateTable(context.Background()); err != nil {
		log.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	// Every handler behind this middleware commits through outcomes.
	durable := idempotency.New(rdb, idempotency.WithOutcomeStore(outcomes), idempotency.WithCallerCredentials())

	transfer := func(tx *sql.Tx, w http.ResponseWriter, r *http.Request) error {
		var in struct{ From, To, Amount int64 }
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Amount <= 0 {
			w.WriteHeader(http.StatusUnprocessableEntity) // sent, not stored: the key is released
			return errors.New("bad transfer")
		}
		ctx := r.Context()
		if _, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = balance - $1 WHERE id = $2", in.Amount, in.From); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = balance + $1 WHERE id = $2", in.Amount, in.To); err != nil {
			return err
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		return json.NewEncoder(w).Encode(in) // committed with the two updates
	}

	mux := http.NewServeMux()
	mux.Handle("POST /transfers", durable.ProtectKey(outcomes.Handler(transfer)))
	log.Fatal(http.ListenAndServe("localhost:8080", mux))
}
