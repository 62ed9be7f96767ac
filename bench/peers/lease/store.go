package main

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// The record's states, as its hash field "state" holds them.
const (
	stateReserved  = "1"
	stateCompleted = "2"
)

// reserveScript claims the key unless a record lives: then it answers the
// record's fields.
// KEYS[1] record; ARGV[1] token, ARGV[2] fingerprint, ARGV[3] the lease's
// end (Unix ms), ARGV[4] the lease in ms.
var reserveScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.call('HGETALL', KEYS[1])
end
redis.call('HSET', KEYS[1], 'state', '1', 'token', ARGV[1], 'fp', ARGV[2], 'lease', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 'OK'
`)

// completeScript stores the answer if the lease is still this token's.
// KEYS[1] record; ARGV[1] token, ARGV[2] answer, ARGV[3] record TTL ms.
var completeScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] or redis.call('HGET', KEYS[1], 'state') ~= '1' then
  return 0
end
redis.call('HSET', KEYS[1], 'state', '2', 'payload', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
`)

// releaseScript drops a reservation that is still this token's.
var releaseScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] or redis.call('HGET', KEYS[1], 'state') ~= '1' then
  return 0
end
return redis.call('DEL', KEYS[1])
`)

type store struct{ rdb *redis.Client }

// A record is what reserve found under a key.
type record struct {
	state, fingerprint string
	leaseEnds          time.Time
	payload            []byte
}

func recordKey(key string) string { return "lease:" + key }

// reserve claims key for token; it answers the record it found instead
// when one lives.
func (s *store) reserve(ctx context.Context, key, token, fp string) (*record, error) {
	ends := time.Now().Add(leaseTTL)
	res, err := reserveScript.Run(ctx, s.rdb, []string{recordKey(key)},
		token, fp, ends.UnixMilli(), leaseTTL.Milliseconds()).Result()
	if err != nil {
		return nil, err
	}
	fields, ok := res.([]any)
	if !ok {
		return nil, nil // "OK": ours
	}
	rec := &record{}
	for i := 0; i+1 < len(fields); i += 2 {
		name, _ := fields[i].(string)
		value, _ := fields[i+1].(string)
		switch name {
		case "state":
			rec.state = value
		case "fp":
			rec.fingerprint = value
		case "lease":
			ms, _ := strconv.ParseInt(value, 10, 64)
			rec.leaseEnds = time.UnixMilli(ms)
		case "payload":
			rec.payload = []byte(value)
		}
	}
	if rec.state != stateReserved && rec.state != stateCompleted {
		return nil, errors.New("corrupt record")
	}
	return rec, nil
}

func (s *store) complete(ctx context.Context, key, token string, payload []byte) error {
	return completeScript.Run(ctx, s.rdb, []string{recordKey(key)}, token, payload, recordTTL.Milliseconds()).Err()
}

func (s *store) release(ctx context.Context, key, token string) error {
	return releaseScript.Run(ctx, s.rdb, []string{recordKey(key)}, token).Err()
}
