-- issue.lua: add one token to a scope's set of outstanding tokens.
-- KEYS[1] the scope's token set (sorted by expiry, in ms since the epoch)
-- ARGV[1] token, ARGV[2] TTL in ms, ARGV[3] cap of outstanding tokens
-- Redis's clock, not the caller's, so instances with skewed clocks agree.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
-- ZADD first: under maxmemory it is refused before anything else ran, so a
-- full Redis issues nothing (a script that already wrote may write on).
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local over = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[3])
if over > 0 then
  redis.call('ZPOPMIN', KEYS[1], over)
end
-- Every token shares one TTL, so the newest one outlives the rest.
redis.call('PEXPIRE', KEYS[1], ttl)
return 1
