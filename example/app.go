package main

import (
	"context"
	"encoding/json"
	"errors"
	"html/template"
	"log/slog"
	"mime"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/example/internal/bank"
	"github.com/onceonly/idempotency/example/internal/input"
	"github.com/onceonly/idempotency/example/internal/provider"
	"github.com/onceonly/idempotency/example/internal/reply"
	"github.com/onceonly/idempotency/optimistic"
)

// A page that reads from the shop's store (Redis, or the database of
// IDEMPOTENCY_STORE) answers 503 at once while it is down or stalled,
// instead of after go-redis's retries, but a listing that is merely large
// must not be cut off as if the store were down. So a read of one record,
// and a PING before a listing, are bounded by probeTimeout; once the store
// has answered the PING, the listing gets listTimeout, which only a store
// that is up but hopelessly slow outlasts.
const (
	probeTimeout = 500 * time.Millisecond
	listTimeout  = 10 * time.Second
)

type app struct {
	idem     *idempotency.Middleware
	store    shopStore
	cfg      config
	provider provider.Charger
}

// newApp wires the shop's routes: token mode for orders, key mode for
// payments and for the transfers of accounts (nil: no transfer routes).
// Its middlewares are drained once the server has stopped.
func newApp(back backend, cfg config, accounts *bank.Bank) (http.Handler, middlewares, error) {
	a := &app{idem: back.protection(cfg.tokenKeys...), store: back.shop, cfg: cfg, provider: chargerOf(cfg)}
	// Payments are API calls: a client library may serialize the same JSON
	// with other key order or spacing on a retry, which is still the same
	// payment. A transient failure (a 5xx of the provider or of our store)
	// does not store the answer, so that the retry runs again: the provider
	// call is a Step keyed by its StepKey and the write is fenced, so
	// running again cannot pay twice, while a stored 503 would refuse the
	// payment for a day. Payments resume: a payment whose instance died
	// mid-way is taken over by the retry once nothing can store for it
	// (the claim horizon: its execution timeout, a lease and four store
	// timeouts, about 10 s here), and a charge the provider made is not
	// made again.
	payments := back.protection(idempotency.WithCallerCredentials(), idempotency.WithFingerprint(idempotency.CanonicalJSON),
		idempotency.WithStorePolicy(idempotency.StoreNoTransient), idempotency.WithResume(),
		idempotency.WithExecutionTimeout(max(5*time.Second, 3*cfg.paymentLatency)), idempotency.WithLockLease(time.Second))
	r := chi.NewRouter()
	r.Use(middleware.Recoverer)
	r.Use(middleware.GetHead) // HEAD of every page, which RFC 9110 asks of a server
	r.Get("/", a.home)
	r.Method(http.MethodGet, "/readyz", a.idem.ReadyHandler()) // a load balancer's readiness probe
	routeStatic(r)
	r.Get("/idempotency/token", a.idem.TokenHandler().ServeHTTP)
	r.With(ordersGuard(a.idem)).Post("/orders", a.createOrder)
	r.Get("/orders", a.listOrders)
	r.Get("/orders/{id}", a.showOrder)
	r.Post("/orders/{id}/cancel", a.cancelOrder)
	r.With(payments.ProtectKey).Post("/payments", a.createPayment)
	r.Get("/payments", a.listPayments)
	callbacks, err := registerCallbacks(r, back, cfg.callbackLatency)
	if err != nil {
		return nil, nil, err
	}
	all := append(middlewares{a.idem, payments}, callbacks...)
	if accounts != nil {
		all = append(all, registerTransfers(r, back, accounts))
	}
	r.NotFound(func(w http.ResponseWriter, req *http.Request) {
		reply.Problem(w, http.StatusNotFound, "not-found", "there is nothing at this address")
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Allow", strings.Join(allowedMethods(r, req.URL.Path), ", "))
		reply.Problem(w, http.StatusMethodNotAllowed, "method-not-allowed",
			"this address does not answer "+req.Method+"; Allow lists the methods it does")
	})
	return r, all, nil
}

// middlewares are the app's protections.
type middlewares []*idempotency.Middleware

// Shutdown waits until every store and release that the store (Redis or
// the database) did not take at once is done: the answers of requests that ran during a Redis blip are
// stored before the process exits.
func (ms middlewares) Shutdown(ctx context.Context) error {
	var errs []error
	for _, m := range ms {
		errs = append(errs, m.Shutdown(ctx))
	}
	return errors.Join(errs...)
}

// allowedMethods lists the methods that r routes for path. chi names them
// only for the methods it knows, and not for one it has never heard of.
func allowedMethods(r chi.Routes, path string) []string {
	var allowed []string
	for _, method := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut,
		http.MethodPatch, http.MethodDelete, http.MethodOptions} {
		if r.Match(chi.NewRouteContext(), method, path) {
			allowed = append(allowed, method)
		}
	}
	return allowed
}

// ordersGuard is the order form's protection: the middleware, unless the
// demo switch IDEMPOTENCY_DISABLED=1 turns it off to show what a double
// click does without it. Never a production setting. Unprotected, the
// handler still runs on a context the client's disconnect does not cancel,
// as under Protect: a double click aborts the first POST, and a real back
// end that has started an order does not stop half-way, so the token check
// is the only difference.
func ordersGuard(idem *idempotency.Middleware) func(http.Handler) http.Handler {
	if !protectionDisabled() {
		return idem.Protect
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			next.ServeHTTP(w, r.WithContext(context.WithoutCancel(r.Context())))
		})
	}
}

// protectionDisabled reports the demo switch IDEMPOTENCY_DISABLED=1.
func protectionDisabled() bool { return os.Getenv("IDEMPOTENCY_DISABLED") == "1" }

func (a *app) home(w http.ResponseWriter, r *http.Request) {
	field, err := a.idem.FormField(w, r)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	ctx, cancel, err := a.listing(r)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	defer cancel()
	orders, err := a.store.orders(ctx)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	// Not no-store: a browser may keep the page for Back, so going back shows
	// the form that was submitted, with its token, and submitting it again is
	// recognised as a duplicate. no-cache still fetches a fresh form (a new
	// token) on every other visit, and private keeps shared caches out.
	w.Header().Set("Cache-Control", "private, no-cache")
	homePage.Execute(w, struct {
		Field  template.HTML
		Orders []Order
	}{field, orders})
}

// orderInput is the body of POST /orders, as JSON or as a form.
type orderInput struct {
	Item     string `json:"item"`
	Quantity int    `json:"quantity"`
}

func (a *app) createOrder(w http.ResponseWriter, r *http.Request) {
	in, isForm, err := decodeOrder(r)
	if err != nil {
		// Nothing ran: the token goes back, so that the corrected form,
		// submitted again with it, places the order.
		idempotency.Release(r.Context())
		reply.Problem(w, http.StatusBadRequest, "invalid-order", err.Error())
		return
	}
	if err := sleep(r.Context(), a.cfg.orderLatency); err != nil {
		a.failExecuted(w, r, err)
		return
	}
	o := &Order{Item: in.Item, Quantity: in.Quantity, Status: "placed", CreatedAt: time.Now().UTC()}
	if err := a.store.addOrder(r.Context(), o); err != nil {
		a.failExecuted(w, r, err)
		return
	}
	location := "/orders/" + strconv.FormatInt(o.ID, 10)
	w.Header().Set("Location", location)
	if isForm {
		w.WriteHeader(http.StatusSeeOther) // Post/Redirect/Get
		return
	}
	reply.JSON(w, http.StatusCreated, o)
}

func decodeOrder(r *http.Request) (orderInput, bool, error) {
	var in orderInput
	mediaType, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	isForm := mediaType == "application/x-www-form-urlencoded" || mediaType == "multipart/form-data"
	if isForm {
		in.Item = r.FormValue("item")
		q, err := strconv.Atoi(r.FormValue("quantity"))
		if err != nil {
			return in, true, errors.New("quantity must be a whole number")
		}
		in.Quantity = q
	} else if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		return in, false, errors.New("body must be a JSON object with item and quantity")
	}
	in.Item = strings.TrimSpace(in.Item)
	switch {
	case !input.Text(in.Item, 100):
		return in, isForm, errors.New("item must be 1 to 100 bytes of printable text")
	case in.Quantity < 1 || in.Quantity > 100:
		return in, isForm, errors.New("quantity must be between 1 and 100")
	}
	return in, isForm, nil
}

func (a *app) listOrders(w http.ResponseWriter, r *http.Request) {
	ctx, cancel, err := a.listing(r)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	defer cancel()
	orders, err := a.store.orders(ctx)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	reply.JSON(w, http.StatusOK, orders)
}

// listing returns the context for a listing's reads from the shop's
// store, bounded by listTimeout, once the store answers a PING within
// probeTimeout; when it does not, the error.
func (a *app) listing(r *http.Request) (context.Context, context.CancelFunc, error) {
	probe, cancel := context.WithTimeout(r.Context(), probeTimeout)
	err := a.store.ping(probe)
	cancel()
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(r.Context(), listTimeout)
	return ctx, cancel, nil
}

// orderID reads the {id} of an order route.
func orderID(r *http.Request) (int64, bool) {
	id, err := strconv.ParseInt(chi.URLParam(r, "id"), 10, 64)
	return id, err == nil
}

func (a *app) showOrder(w http.ResponseWriter, r *http.Request) {
	id, ok := orderID(r)
	if !ok {
		http.NotFound(w, r)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), probeTimeout)
	defer cancel()
	o, err := a.store.order(ctx, id)
	if errors.Is(err, errNoOrder) {
		http.NotFound(w, r)
		return
	}
	if err != nil {
		a.fail(w, r, err)
		return
	}
	if strings.Contains(r.Header.Get("Accept"), "text/html") {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		orderPage.Execute(w, o)
		return
	}
	reply.JSON(w, http.StatusOK, o)
}

// cancelOrder cancels a placed order. It needs no idempotency key: the
// status change is a compare-and-set, so a repeated or concurrent cancel
// finds the order cancelled and is answered 409.
func (a *app) cancelOrder(w http.ResponseWriter, r *http.Request) {
	id, ok := orderID(r)
	if !ok {
		http.NotFound(w, r)
		return
	}
	o, err := a.store.cancelOrder(r.Context(), id)
	switch {
	case errors.Is(err, errNoOrder):
		http.NotFound(w, r)
	case errors.Is(err, errNotCancelable):
		reply.Problem(w, http.StatusConflict, "not-cancelable", "only a placed order can be cancelled")
	case err != nil:
		a.fail(w, r, err)
	default:
		reply.JSON(w, http.StatusOK, o)
	}
}

type paymentInput struct {
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// currencyCode reports whether s is three ASCII letters, as ISO 4217's
// codes are (in either case: the payment keeps them upper-case).
func currencyCode(s string) bool {
	if len(s) != 3 {
		return false
	}
	for _, c := range []byte(s) {
		if (c < 'A' || c > 'Z') && (c < 'a' || c > 'z') {
			return false
		}
	}
	return true
}

func (a *app) createPayment(w http.ResponseWriter, r *http.Request) {
	var in paymentInput
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Amount <= 0 || !currencyCode(in.Currency) {
		// Nothing ran: the key goes back for the corrected request.
		idempotency.Release(r.Context())
		reply.Problem(w, http.StatusBadRequest, "invalid-payment",
			"body must be a JSON object with a positive amount (in cents) and a 3-letter currency")
		return
	}
	// The key as the middleware read it: "abc" and abc are one key.
	key, _ := idempotency.HeaderKey(idempotency.KeyHeader)(r, nil)
	// The payment provider's call: slow, and not to be made twice. As a
	// step it is journaled with the key once it answered, and a run that
	// resumes this payment gets the charge back without calling; a run cut
	// off during the call calls again with the same key, which the
	// provider answers with the same charge.
	charge, err := idempotency.Step(r.Context(), "charge", func(ctx context.Context) (provider.Charge, error) {
		return a.provider.Charge(ctx, idempotency.StepKey(ctx, "charge"), in.Amount, strings.ToUpper(in.Currency))
	})
	if err != nil {
		a.failExecuted(w, r, err)
		return
	}
	p := &Payment{
		ID: paymentID(key), Charge: charge.ID,
		Amount: in.Amount, Currency: strings.ToUpper(in.Currency), Status: "captured", CreatedAt: time.Now().UTC(),
	}
	err = a.store.capturePayment(r.Context(), p, idempotency.FencingToken(r.Context()))
	if errors.Is(err, optimistic.ErrStaleFence) {
		// Another instance took this key over while we were stalled; its
		// write stands, and our answer is never stored.
		reply.Problem(w, http.StatusConflict, "superseded", "this payment was completed by another attempt")
		return
	}
	if err != nil {
		a.failExecuted(w, r, err)
		return
	}
	w.Header().Set("Location", "/payments/"+p.ID)
	reply.JSON(w, http.StatusCreated, p)
}

func (a *app) listPayments(w http.ResponseWriter, r *http.Request) {
	ctx, cancel, err := a.listing(r)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	defer cancel()
	payments, err := a.store.payments(ctx)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	reply.JSON(w, http.StatusOK, payments)
}

// failExecuted answers a failure inside a protected handler: the answer is
// stored and replayed, so it must not say "nothing ran, retry" (a 503 with
// Retry-After would send a retrying client round for the record's whole
// lifetime), and for a payment something did run.
func (a *app) failExecuted(w http.ResponseWriter, r *http.Request, err error) {
	slog.Error("example: a protected request failed", "path", r.URL.Path, "error", err)
	reply.Problem(w, http.StatusInternalServerError, "internal", "the shop could not complete the request")
}

// fail answers a failure of the shop's store without showing it to the
// client: 503 with Retry-After, as the protected routes answer, since
// nothing was done and a retry may succeed.
func (a *app) fail(w http.ResponseWriter, r *http.Request, err error) {
	if !errors.Is(err, idempotency.ErrStoreUnavailable) {
		slog.Error("example: the shop's store failed", "path", r.URL.Path, "error", err)
	}
	idempotency.DefaultErrorHandler(w, r, idempotency.ErrStoreUnavailable)
}

// sleep waits like a slow back end; it ends early only if the context does.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// chargerOf is the payment provider cfg names: the one at its URL, or one
// in this process.
func chargerOf(cfg config) provider.Charger {
	if cfg.providerURL != "" {
		return &provider.Client{URL: strings.TrimSuffix(cfg.providerURL, "/"), HTTP: &http.Client{}}
	}
	return &provider.Provider{Latency: cfg.paymentLatency}
}
