package main

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/onceonly/idempotency"
	"github.com/redis/go-redis/v9"
)

// Versions before the key ring kept the token secret in Redis:
// PREFIX:token-secret, and the secrets it replaced in the sorted set
// PREFIX:token-secret:retired. tokenKeys prints them as the ring that keeps
// every token out meaning what it meant (ParseTokenKeys's form): the kept
// secret signs, the retired ones are revoked, so that their spent tokens
// still replay.
func (s *session) tokenKeys(ctx context.Context, stdout io.Writer, prefix string) error {
	step, cancel := s.step(ctx)
	defer cancel()
	secret, err := s.rdb.Get(step, prefix+":token-secret").Bytes()
	switch {
	case errors.Is(err, redis.Nil):
		return fmt.Errorf("Redis keeps no token secret under %s:token-secret: there is nothing to carry over "+
			"(give every instance a new ring: sign=%s)", prefix, idempotency.NewTokenKey())
	case err != nil:
		return fmt.Errorf("reading %s:token-secret: %w", prefix, err)
	}
	retired, err := s.rdb.ZRange(step, prefix+":token-secret:retired", 0, -1).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("reading %s:token-secret:retired: %w", prefix, err)
	}
	ring := []string{"sign=" + base64.RawURLEncoding.EncodeToString(secret)}
	for _, r := range retired {
		if r != string(secret) {
			ring = append(ring, "revoked="+base64.RawURLEncoding.EncodeToString([]byte(r)))
		}
	}
	_, err = fmt.Fprintln(stdout, strings.Join(ring, " "))
	return err
}
