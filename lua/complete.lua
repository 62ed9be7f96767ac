-- complete.lua: store the executor's answer and release its lock.
-- KEYS[1] record hash, KEYS[2] lock, KEYS[3] waiters flag (also the channel)
-- ARGV[1] our lock value, ARGV[2] state (done or big), ARGV[3] status,
-- ARGV[4] headers, ARGV[5] body, ARGV[6] record TTL ms, ARGV[7] fingerprint,
-- ARGV[8] our fencing token
-- Returns 1 when the answer is stored, 2 when it is stored although the
-- record had vanished while the handler ran (evicted, expired, flushed), and
-- 0 when another executor owns the key now, or an operator settled it
-- (then nothing is written). Our lock is released whatever the answer. Safe
-- to run twice.
local rec = redis.call('HMGET', KEYS[1], 'st', 'o', 'w')
local stored = 0
if not rec[1] or rec[1] == 'forgotten' then
  -- No record is claimed now (a claim writes one; an operator forgot the
  -- claim, taking our executor for gone), so our answer is the key's:
  -- writing it back keeps a retry from running the handler a second time. Under maxmemory the HSET must not be the script's first write
  -- (see below), so the lock goes first, and a PEXPIRE (a write that
  -- cannot grow memory) when the lock is no longer ours. 'w' tells a
  -- resend that the record was written back.
  if redis.call('GET', KEYS[2]) == ARGV[1] then
    redis.call('DEL', KEYS[2])
  else
    redis.call('PEXPIRE', KEYS[1], ARGV[6])
  end
  redis.call('HSET', KEYS[1], 'st', ARGV[2], 'o', ARGV[1], 'fp', ARGV[7],
    'c', ARGV[3], 'h', ARGV[4], 'b', ARGV[5], 'n', 1, 'f', ARGV[8], 'w', 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[6])
  stored = 2
elseif rec[2] == ARGV[1] then
  if rec[1] == 'run' then
    -- The handler has run: its answer must be kept even if Redis reached
    -- maxmemory meanwhile. Redis refuses a memory-growing command only in a
    -- script that has not written yet, so a write that cannot grow memory
    -- goes first. (PEXPIRE rather than HDEL: an HDEL first leaves the hash
    -- three times larger once the body is in.)
    redis.call('PEXPIRE', KEYS[1], ARGV[6])
    redis.call('HSET', KEYS[1], 'st', ARGV[2], 'c', ARGV[3], 'h', ARGV[4], 'b', ARGV[5])
  end
  stored = 1
  if rec[3] then
    stored = 2
  end
end
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
end
-- Only a key that another instance is waiting for costs a message.
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('PUBLISH', KEYS[3], 'done')
end
return stored
