-- settle.lua: an operator settles an interrupted key: stores a committed
-- answer as its record, or deletes the record so that a retry runs again.
-- KEYS[1] record hash, KEYS[2] lock, KEYS[3] waiters flag (also the channel)
-- ARGV[1] 'answer' or 'forget', ARGV[2] the lock value of the claim the
-- operator inspected; for 'answer': ARGV[3] status, ARGV[4] headers,
-- ARGV[5] body, ARGV[6] fingerprint ('' keeps the record's), ARGV[7]
-- record TTL ms, used only when the record has none
--
-- It acts only while the key is interrupted, the state claim.lua calls
-- abandoned: claimed (st run) under a lock value that nobody holds the lock
-- with. Checking inside the script is what makes it safe: a claim, a store
-- or a takeover that runs just before sees its own result kept, one that
-- runs just after sees the settled record.
-- Replies: 'settled', or why not: 'none' (no record), 'done', 'big' (an
-- answer is stored), 'running' (the executor holds its lock), 'mismatch'
-- (the answer is another request's), 'changed' (claimed anew since the
-- operator looked: that claim may be running, stalled past its lease).
local rec = redis.call('HMGET', KEYS[1], 'st', 'o', 'fp')
if not rec[1] then
  return 'none'
end
if rec[1] ~= 'run' then
  return rec[1]
end
if redis.call('GET', KEYS[2]) == rec[2] then
  return 'running'
end
if rec[2] ~= ARGV[2] then
  return 'changed'
end
if ARGV[1] == 'forget' then
  -- A token-mode key's token is not given back: its retry is answered
  -- token-not-found and fetches a new token, as after any spent token,
  -- rather than a form's token coming back to life hours later.
  redis.call('DEL', KEYS[1])
else
  if ARGV[6] ~= '' and ARGV[6] ~= rec[3] then
    return 'mismatch'
  end
  -- HSET first: under maxmemory it is refused before anything else ran.
  redis.call('HSET', KEYS[1], 'st', 'done', 'c', ARGV[3], 'h', ARGV[4], 'b', ARGV[5])
  if redis.call('PTTL', KEYS[1]) < 0 then
    redis.call('PEXPIRE', KEYS[1], ARGV[7])
  end
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('PUBLISH', KEYS[3], 'settled')
end
return 'settled'
