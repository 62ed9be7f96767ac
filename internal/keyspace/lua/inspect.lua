-- inspect.lua: read what Redis holds for one key in one step, so that an
-- operator never sees a record from before a store and a lock from after it.
-- KEYS[1] record hash, KEYS[2] lock, KEYS[3] waiters flag
-- Reply: {st, o, fp, c, n, f, body length, record PTTL, lock value,
-- lock PTTL, waiters flag exists}; '' for what is missing. (A Lua false
-- would end the reply array early.)
local rec = redis.call('HMGET', KEYS[1], 'st', 'o', 'fp', 'c', 'n', 'f')
for i = 1, 6 do
  rec[i] = rec[i] or ''
end
return {rec[1], rec[2], rec[3], rec[4], rec[5], rec[6],
  redis.call('HSTRLEN', KEYS[1], 'b'), redis.call('PTTL', KEYS[1]),
  redis.call('GET', KEYS[2]) or '', redis.call('PTTL', KEYS[2]),
  redis.call('EXISTS', KEYS[3])}
