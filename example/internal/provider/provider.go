// Package provider is the shop's payment provider: a fake one, which
// charges nothing real but keeps the promise real providers make about
// their own Idempotency-Key. A charge sent twice with one key is one
// charge, and both calls get it. The shop passes each payment's step key
// (idempotency.StepKey), so that a payment cut off in the middle of its
// call, and resumed on another instance, charges once.
//
// It answers POST /charges ({"amount": cents, "currency": "EUR"}, with an
// Idempotency-Key header) with 201 and the charge, and GET /charges with
// every charge it made. A charge is made as the call arrives and answered
// Latency later, as a slow provider that has already taken the money
// would.
package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/onceonly/idempotency/example/internal/reply"
)

// A Charge is one charge the provider made.
type Charge struct {
	ID       string `json:"id"`
	Key      string `json:"key"` // the Idempotency-Key it was made with
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// Provider is the fake provider, an http.Handler. Its charges live in its
// memory: run it in a process that outlives the shop's instances.
type Provider struct {
	Latency time.Duration

	mu      sync.Mutex
	charges []Charge
	byKey   map[string]int // Idempotency-Key → index in charges
	calls   int
}

// Calls is how many charges were asked for, repeats included.
func (p *Provider) Calls() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls
}

func (p *Provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet:
		p.mu.Lock()
		all := append([]Charge{}, p.charges...)
		p.mu.Unlock()
		reply.JSON(w, http.StatusOK, all)
	case http.MethodPost:
		p.charge(w, r)
	default:
		w.Header().Set("Allow", "GET, POST")
		reply.Problem(w, http.StatusMethodNotAllowed, "method-not-allowed", "GET or POST /charges")
	}
}

func (p *Provider) charge(w http.ResponseWriter, r *http.Request) {
	var in Charge
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		reply.Problem(w, http.StatusBadRequest, "invalid-charge", "the body must be a JSON charge")
		return
	}
	c, err := p.Charge(r.Context(), r.Header.Get("Idempotency-Key"), in.Amount, in.Currency)
	switch {
	case errors.Is(err, errInvalid):
		reply.Problem(w, http.StatusBadRequest, "invalid-charge", err.Error())
	case errors.Is(err, errKeyReused):
		reply.Problem(w, http.StatusUnprocessableEntity, "key-reused", err.Error())
	case err != nil:
		return // the caller left; the money is taken all the same
	default:
		reply.JSON(w, http.StatusCreated, c)
	}
}

var (
	errInvalid   = errors.New("provider: an Idempotency-Key and a positive amount are required")
	errKeyReused = errors.New("provider: the key was used for another charge")
)

// Charge charges amount under key, or returns the charge key made before.
// The charge is made at once, and returned Latency later.
func (p *Provider) Charge(ctx context.Context, key string, amount int64, currency string) (Charge, error) {
	if key == "" || amount <= 0 {
		return Charge{}, errInvalid
	}
	p.mu.Lock()
	p.calls++
	if p.byKey == nil {
		p.byKey = map[string]int{}
	}
	i, seen := p.byKey[key]
	if !seen {
		i = len(p.charges)
		p.byKey[key] = i
		p.charges = append(p.charges, Charge{ID: fmt.Sprintf("ch_%d", i+1), Key: key, Amount: amount, Currency: currency})
	}
	c := p.charges[i]
	p.mu.Unlock()
	if seen && (c.Amount != amount || c.Currency != currency) {
		return Charge{}, errKeyReused
	}
	timer := time.NewTimer(p.Latency)
	defer timer.Stop()
	select {
	case <-timer.C:
		return c, nil
	case <-ctx.Done():
		return Charge{}, ctx.Err()
	}
}

// A Charger charges: a Provider in this process, or a Client of one in
// another.
type Charger interface {
	Charge(ctx context.Context, key string, amount int64, currency string) (Charge, error)
}

// Client calls a provider at URL (its base, without /charges).
type Client struct {
	URL  string
	HTTP *http.Client
}

// Charge charges amount with key as the call's Idempotency-Key.
func (c *Client) Charge(ctx context.Context, key string, amount int64, currency string) (Charge, error) {
	body, _ := json.Marshal(Charge{Amount: amount, Currency: currency})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL+"/charges", bytes.NewReader(body))
	if err != nil {
		return Charge{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return Charge{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return Charge{}, fmt.Errorf("provider: charge answered %s", resp.Status)
	}
	var ch Charge
	if err := json.NewDecoder(resp.Body).Decode(&ch); err != nil {
		return Charge{}, fmt.Errorf("provider: %w", err)
	}
	return ch, nil
}
