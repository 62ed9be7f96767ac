package recipetest

import (
	"encoding/json"
	"errors"
	"net/http"
	"sync/atomic"
	"time"
)

// Order is the JSON body the tests POST to every protected route.
type Order struct {
	Amount int `json:"amount"`
}

// Receipt is a handler's answer. Run numbers the handler's runs, so a replay
// (the same number) is told apart from a second run.
type Receipt struct {
	Run int64 `json:"run"`
}

// ErrNoAmount is what a handler answers, with 400, to an order of nothing.
var ErrNoAmount = errors.New("amount must be positive")

// Shop is the application behind a recipe's protected routes: the side
// effect each route must have at most once per token or key.
type Shop struct {
	runs atomic.Int64
}

// Place is the side effect. It counts every run, refused ones too, and takes
// a moment, so that concurrent duplicates arrive while it still runs.
func (s *Shop) Place(o Order) (Receipt, error) {
	run := s.runs.Add(1)
	time.Sleep(20 * time.Millisecond)
	if o.Amount <= 0 {
		return Receipt{}, ErrNoAmount
	}
	return Receipt{Run: run}, nil
}

// Runs is how often Place ran.
func (s *Shop) Runs() int64 { return s.runs.Load() }

// ServeHTTP is Place as a net/http handler, the kind gin and chi protect.
func (s *Shop) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var o Order
	if err := json.NewDecoder(r.Body).Decode(&o); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	receipt, err := s.Place(o)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(receipt)
}
