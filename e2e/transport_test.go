package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-retryablehttp"
	"github.com/onceonly/idempotency"
	idemclient "github.com/onceonly/idempotency/client"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/internal/shopproc"
	"github.com/stretchr/testify/require"
)

const paymentBody = `{"amount":500,"currency":"EUR"}`

// A sender posts paymentBody to url through one client set-up.
type sender func(t *testing.T, url string) (*http.Response, error)

// The Go client against the example shop's POST /payments, through a proxy
// that loses the first two answers: each set-up that keeps one key gets the
// shop to pay once and hands its caller the replayed answer; the one that
// lets go-retryablehttp retry over a Transport without a key of the
// caller's pays once per attempt, as docs/client.md warns.
func TestTransportLostAnswersPayOnce(t *testing.T) {
	bin := shopproc.Build(t, t.TempDir(), false)
	redisAddr := redistest.Private(t).Addr()
	for i, tc := range []struct {
		name     string
		send     sender
		keys     int // distinct keys over the three attempts
		payments int
	}{
		{"http.Client with Transport", viaTransport, 1, 1},
		{"go-retryablehttp RetryMax 0 over Transport", viaRetryablehttpOverTransport, 1, 1},
		{"go-retryablehttp retries over Transport, caller's key", viaRetryablehttpRetriesWithKey, 1, 1},
		{"Transport over go-retryablehttp's RoundTripper", viaTransportOverRetryablehttp, 1, 1},
		{"go-retryablehttp retries over Transport, no key", viaRetryablehttpRetriesWithoutKey, 3, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startShop(t, bin, redisURL(redisAddr, i+1))
			proxy := startLossyProxy(t, strings.TrimPrefix(s.URL, "http://"))
			proxy.loseNext(2)
			resp, err := tc.send(t, proxy.URL()+"/payments")
			require.NoError(t, err)
			p := readPayment(t, resp)

			seen := proxy.seen()
			require.Len(t, seen, 3, "two answers lost, the third delivered")
			keys := map[string]bool{}
			for i, ex := range seen {
				require.Equal(t, i < 2, ex.lost)
				require.Equal(t, http.StatusCreated, ex.status)
				require.NotEmpty(t, ex.key)
				keys[ex.key] = true
			}
			require.Len(t, keys, tc.keys)
			require.Equal(t, tc.payments, s.count(t, "/payments"))
			require.Equal(t, http.StatusCreated, resp.StatusCode)
			require.Equal(t, int64(500), p.Amount)
			if tc.keys == 1 {
				require.False(t, seen[0].replayed, "the first attempt ran the payment")
				require.True(t, seen[1].replayed && seen[2].replayed, "every later attempt was answered from the record")
				require.Equal(t, "true", resp.Header.Get(idempotency.ReplayedHeader), "the caller sees the replay")
			} else {
				require.Empty(t, resp.Header.Get(idempotency.ReplayedHeader))
			}
		})
	}
}

// A 422 (the key reused with another body) is the final answer: the client
// sends it once and returns it, while a lost answer before it was retried.
func TestTransportNeverRetriesAReusedKey(t *testing.T) {
	s := startShop(t, shopproc.Build(t, t.TempDir(), false), redisURL(redistest.Private(t).Addr(), 1))
	proxy := startLossyProxy(t, strings.TrimPrefix(s.URL, "http://"))
	client := &http.Client{Timeout: 30 * time.Second, Transport: &idemclient.Transport{Base: newBase(t),
		BaseDelay: 10 * time.Millisecond}}
	post := func(body string) *http.Response {
		req, err := http.NewRequest(http.MethodPost, proxy.URL()+"/payments", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idempotency.KeyHeader, "order-8-payment")
		resp, err := client.Do(req)
		require.NoError(t, err)
		return resp
	}

	proxy.loseNext(1)
	readPayment(t, post(paymentBody))
	require.Len(t, proxy.seen(), 2, "the lost answer was retried")

	resp := post(`{"amount":700,"currency":"EUR"}`)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode, string(body))
	require.Contains(t, string(body), idempotency.ProblemTypeBase+"key-reused")
	seen := proxy.seen()
	require.Len(t, seen, 1, "sent once")
	require.Equal(t, "order-8-payment", seen[0].key)
	require.Equal(t, 1, s.count(t, "/payments"))
}

// The recommended composition: our Transport does the retries, by the
// middleware's rules, with one key.
func viaTransport(t *testing.T, url string) (*http.Response, error) {
	client := &http.Client{Timeout: 30 * time.Second, Transport: &idemclient.Transport{Base: newBase(t),
		BaseDelay: 10 * time.Millisecond}}
	return client.Post(url, "application/json", strings.NewReader(paymentBody))
}

// A code base built on go-retryablehttp keeps its client and hands the
// retries to the Transport under it: RetryMax 0, and the last answer passed
// through instead of turned into an error.
func viaRetryablehttpOverTransport(t *testing.T, url string) (*http.Response, error) {
	rc := retryableClient(0)
	rc.HTTPClient.Transport = &idemclient.Transport{Base: newBase(t), BaseDelay: 10 * time.Millisecond}
	return rc.Do(retryableRequest(t, url, ""))
}

// go-retryablehttp's retries over a Transport that only adds the key: one
// key, since the caller set it on the request that every retry resends.
func viaRetryablehttpRetriesWithKey(t *testing.T, url string) (*http.Response, error) {
	rc := retryableClient(2)
	rc.HTTPClient.Transport = &idemclient.Transport{Base: newBase(t), MaxAttempts: 1}
	return rc.Do(retryableRequest(t, url, "order-8-payment"))
}

// The Transport outside go-retryablehttp: the key is on the request before
// go-retryablehttp's retries resend it.
func viaTransportOverRetryablehttp(t *testing.T, url string) (*http.Response, error) {
	rc := retryableClient(2)
	rc.HTTPClient.Transport = newBase(t)
	client := &http.Client{Timeout: 30 * time.Second,
		Transport: &idemclient.Transport{Base: &retryablehttp.RoundTripper{Client: rc}, MaxAttempts: 1}}
	return client.Post(url, "application/json", strings.NewReader(paymentBody))
}

// The composition not to use: each of go-retryablehttp's retries resends
// the caller's request, which has no key, and the Transport, which never
// writes into the caller's request, gives each a new one.
func viaRetryablehttpRetriesWithoutKey(t *testing.T, url string) (*http.Response, error) {
	rc := retryableClient(2)
	rc.HTTPClient.Transport = &idemclient.Transport{Base: newBase(t), MaxAttempts: 1}
	return rc.Do(retryableRequest(t, url, ""))
}

func retryableClient(retries int) *retryablehttp.Client {
	rc := retryablehttp.NewClient()
	rc.HTTPClient = &http.Client{Timeout: 30 * time.Second}
	rc.RetryMax = retries
	rc.RetryWaitMin, rc.RetryWaitMax = 10*time.Millisecond, 50*time.Millisecond
	rc.ErrorHandler = retryablehttp.PassthroughErrorHandler
	rc.Logger = nil
	return rc
}

func retryableRequest(t *testing.T, url, key string) *retryablehttp.Request {
	req, err := retryablehttp.NewRequest(http.MethodPost, url, []byte(paymentBody))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(idempotency.KeyHeader, key)
	}
	return req
}

// newBase is a connection pool of the test's own, so that no connection
// outlives it.
func newBase(t *testing.T) *http.Transport {
	base := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(base.CloseIdleConnections)
	return base
}

type payment struct {
	ID     string `json:"id"`
	Amount int64  `json:"amount"`
	Status string `json:"status"`
}

// readPayment reads a 201 answer of POST /payments and closes it.
func readPayment(t *testing.T, resp *http.Response) payment {
	t.Helper()
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode, string(body))
	var p payment
	require.NoError(t, json.Unmarshal(body, &p), string(body))
	require.Equal(t, "captured", p.Status)
	return p
}
