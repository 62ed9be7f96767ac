-- release.lua: undo a claim whose run must not count as executed (nothing
-- of it can take effect any more: see lifecycle.go), so a retry runs.
-- KEYS[1] record hash, KEYS[2] lock, KEYS[3] waiters flag (also the channel)
-- ARGV[1] our lock value
-- An issued token's record is what marks it spent, so deleting the record
-- gives the token back until it expires.
local rec = redis.call('HMGET', KEYS[1], 'st', 'o')
if rec[1] == 'run' and rec[2] == ARGV[1] then
  redis.call('DEL', KEYS[1])
end
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('PUBLISH', KEYS[3], 'released')
end
return 1
