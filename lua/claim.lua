-- claim.lua: decide what a request holding the key's lock does next.
-- KEYS[1] record hash, KEYS[2] lock
-- ARGV[1] our lock value, ARGV[2] request fingerprint, ARGV[3] record TTL ms,
-- ARGV[4] 't' for an issued token (whose signature and expiry the caller
-- checked), ARGV[5] '1' to retry abandoned executions
--
-- Record fields: st state (run, done, big), o lock value of the executor,
-- fp fingerprint, c status, h headers, b body, n executions, f fencing token,
-- w set when the store wrote a vanished record back, s the claim an operator
-- settled (settle.lua), p and q the lock value and token of the executor a
-- takeover took the key from. A record in state 'forgotten' is read as no record,
-- except for a token, which it keeps spent.
--
-- A token's record is what marks it spent: it outlives the token, so a
-- token with no record has never been spent (or was given back).
--
-- The fencing token is Redis's clock in microseconds at the claim, and
-- always above the key's previous one: storage that remembers the highest
-- token it accepted can refuse a write from an executor whose lease ran out
-- and whose key was taken over.
--
-- Replies: {'claimed', f} run the handler ({'claimed', f, 'retaken'} when
-- it takes an abandoned execution over); {'done', c, h, b, ttl} replay
-- (ttl: the record's remaining milliseconds);
-- {'unknown'}, {'mismatch'}, {'big'}, {'abandoned'}, {'lost'}.
-- Every reply but 'claimed' releases our lock. Running the script again with
-- the same ARGV (go-redis resends when a reply is lost) gives the same reply:
-- a repeated claim answers 'claimed' to the same executor, and every other
-- answer is decided from what the record and the lock say, without needing
-- our lock a second time.
local function unlock()
  if redis.call('GET', KEYS[2]) == ARGV[1] then
    redis.call('DEL', KEYS[2])
  end
end

local rec = redis.call('HMGET', KEYS[1], 'st', 'o', 'fp', 'c', 'h', 'b', 'f', 'n')
local st = rec[1]
if st == 'forgotten' then
  if ARGV[4] == 't' then
    unlock()
    return {'unknown'}
  end
  st = nil
end
if st then
  if st == 'run' and rec[2] == ARGV[1] then
    if rec[8] and rec[8] ~= '1' then
      -- Our own takeover, resent: it says so again (a fresh claim writes
      -- n = 1, and only a takeover raises it).
      return {'claimed', rec[7], 'retaken'}
    end
    return {'claimed', rec[7]}
  end
  if rec[3] ~= ARGV[2] then
    unlock()
    return {'mismatch'}
  end
  if st == 'done' then
    unlock()
    return {'done', rec[4], rec[5], rec[6], redis.call('PTTL', KEYS[1])}
  end
  if st == 'big' then
    unlock()
    return {'big'}
  end
  -- A run under another lock value. Its executor lives exactly as long as
  -- it holds the lock; once nobody holds it under that value, the
  -- execution was abandoned: its lease ran out before it stored an answer.
  local holder = redis.call('GET', KEYS[2])
  if holder == rec[2] then
    return {'lost'} -- our lease ran out and that executor holds the key
  end
  if ARGV[5] ~= '1' then
    unlock()
    return {'abandoned'}
  end
  if holder ~= ARGV[1] then
    return {'lost'} -- taking over writes, and writes need our lock
  end
  local t = redis.call('TIME')
  local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local fence = math.max(tonumber(rec[7]) + 1, now_us)
  redis.call('HINCRBY', KEYS[1], 'n', 1)
  -- p and q keep the abandoned executor's lock value and token, so that
  -- undoing this takeover (release.lua) hands the key back to it rather
  -- than free: that executor may be stalled, not gone, and still store.
  redis.call('HSET', KEYS[1], 'o', ARGV[1], 'f', string.format('%.0f', fence), 'p', rec[2], 'q', rec[7])
  return {'claimed', string.format('%.0f', fence), 'retaken'}
end

-- Everything below writes, so it needs the lock.
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return {'lost'}
end

-- The record first: under maxmemory HSET is refused before anything else
-- ran, so a full Redis fails the claim and the handler never starts.
local t = redis.call('TIME')
local fence = string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2]))
redis.call('HSET', KEYS[1], 'st', 'run', 'o', ARGV[1], 'fp', ARGV[2], 'n', 1, 'f', fence)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {'claimed', fence}
