// Package floorlua holds the floor's two scripts, for its server and for
// the benchmark that measures what each script costs Redis beside this
// library's (bench/scriptcost).
package floorlua

import "github.com/redis/go-redis/v9"

// Claim: KEYS[1] record, KEYS[2] lock; ARGV[1] our lock value,
// ARGV[2] record TTL ms. Returns the record when there is one (a resend of
// our own claim finds "r" and our value), 0 when the lock is not ours, or
// the fence (Redis's clock in µs) once the key is claimed.
var Claim = redis.NewScript(`
local r = redis.call('GET', KEYS[1])
if r then
  if r:sub(1, 1) == 'd' and redis.call('GET', KEYS[2]) == ARGV[1] then
    redis.call('DEL', KEYS[2])
  end
  return r
end
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return 0
end
local t = redis.call('TIME')
redis.call('SET', KEYS[1], 'r' .. ARGV[1], 'PX', ARGV[2])
return t[1] * 1000000 + t[2]
`)

// Complete: KEYS[1] record, KEYS[2] lock; ARGV[1] our lock value,
// ARGV[2] the done record, ARGV[3] record TTL ms. Stores the answer when
// the key is still ours (or its record vanished) and lets the lock go.
var Complete = redis.NewScript(`
local r = redis.call('GET', KEYS[1])
local stored = 0
if not r or r == 'r' .. ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  stored = 1
end
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
end
return stored
`)
