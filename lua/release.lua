-- release.lua: undo a claim whose handler must not count as executed (it
-- panicked, or answered 5xx under WithReleaseOnServerError), so a retry runs.
-- KEYS[1] record hash, KEYS[2] lock, KEYS[3] waiters flag (also the channel),
-- KEYS[4] the scope's token set (token mode)
-- ARGV[1] our lock value, ARGV[2] token (token mode), ARGV[3] token cap
-- An issued token goes back to its scope with its original expiry.
local rec = redis.call('HMGET', KEYS[1], 'st', 'o', 'x')
if rec[1] == 'run' and rec[2] == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if #KEYS == 4 and rec[3] and rec[3] ~= '' then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local left = tonumber(rec[3]) - now
    if left > 0 then
      redis.call('ZADD', KEYS[4], rec[3], ARGV[2])
      if redis.call('PTTL', KEYS[4]) < left then
        redis.call('PEXPIRE', KEYS[4], left)
      end
      local over = redis.call('ZCARD', KEYS[4]) - tonumber(ARGV[3])
      if over > 0 then
        redis.call('ZPOPMIN', KEYS[4], over)
      end
    end
  end
end
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('PUBLISH', KEYS[3], 'released')
end
return 1
