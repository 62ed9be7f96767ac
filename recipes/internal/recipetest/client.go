package recipetest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/onceonly/idempotency"
)

// Answer is what a test reads of a response.
type Answer struct {
	Status      int
	Replayed    bool // Idempotent-Replayed: true
	ContentType string
	Body        string
}

// Post sends body as JSON to url with key as Idempotency-Key. It reports
// failures as errors rather than through t, so goroutines can call it.
func Post(c *http.Client, url, key, body string) (Answer, error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return Answer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idempotency.KeyHeader, key)
	res, err := c.Do(req)
	if err != nil {
		return Answer{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return Answer{}, err
	}
	return Answer{
		Status:      res.StatusCode,
		Replayed:    res.Header.Get(idempotency.ReplayedHeader) == "true",
		ContentType: res.Header.Get("Content-Type"),
		Body:        string(b),
	}, nil
}

// fetchToken asks the token endpoint for a token, as a page's script would;
// c must keep cookies, since the token is bound to the session it starts.
func fetchToken(c *http.Client, url string) (string, error) {
	res, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return "", fmt.Errorf("token endpoint answered %s", res.Status)
	}
	var t struct {
		Token string `json:"token"`
	}
	if err := json.NewDecoder(res.Body).Decode(&t); err != nil {
		return "", err
	}
	return t.Token, nil
}
