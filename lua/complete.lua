-- complete.lua: store the executor's response and release its lock.
-- KEYS[1] record hash, KEYS[2] lock, KEYS[3] waiters flag (also the channel)
-- ARGV[1] our lock value, ARGV[2] state (done or big), ARGV[3] status,
-- ARGV[4] headers, ARGV[5] body, ARGV[6] record TTL ms
-- Returns 1 when the record is ours and stored, 0 when another executor took
-- the key over (then nothing is written). Safe to run twice.
local rec = redis.call('HMGET', KEYS[1], 'st', 'o')
if rec[2] ~= ARGV[1] then
  return 0
end
if rec[1] == 'run' then
  -- The handler has run: its answer must be kept even if Redis reached
  -- maxmemory meanwhile. Redis refuses a memory-growing command only in a
  -- script that has not written yet, so a write that cannot grow memory
  -- goes first. (PEXPIRE rather than HDEL: an HDEL first leaves the hash
  -- three times larger once the body is in.)
  redis.call('PEXPIRE', KEYS[1], ARGV[6])
  redis.call('HSET', KEYS[1], 'st', ARGV[2], 'c', ARGV[3], 'h', ARGV[4], 'b', ARGV[5])
  redis.call('HDEL', KEYS[1], 'x')
end
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
end
-- Only a key that another instance is waiting for costs a message.
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('PUBLISH', KEYS[3], 'done')
end
return 1
