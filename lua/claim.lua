-- claim.lua: take the key's lease and claim the key, or say why not.
-- KEYS[1] record, KEYS[2] lock
-- ARGV[1] our lock value (fresh and random for each attempt), ARGV[2] request fingerprint (hex), ARGV[3] record
-- TTL ms, ARGV[4] 't' for an issued token (whose signature the caller
-- checked), 'x' for one past its expiry, which may be answered from its
-- record but never spent, 'r' for one that only its record may answer (its
-- secret was retired), ARGV[5] '1' to retry abandoned executions once their
-- lock lapsed, '2' to resume them once nothing can store for them any more
-- (past the horizon, or kept), '0' for neither, ARGV[6]
-- the claim horizon in ms: how long after its claim an executor may still
-- store an answer (its execution timeout, then the retries of its store),
-- ARGV[7] the lease in ms, ARGV[8] (with 't') when the token expires, in
-- microseconds on Redis's clock: the one clock every instance's claims of
-- the token meet, so that a token answered as expired is never spent by
-- a claim that was sent in time and landed after
--
-- The lease is the lock: a key that holds our lock value for a lease, taken
-- here (SET NX PX) only when the claim writes, and renewed, released and
-- taken back by the other scripts. Nobody else takes it: a claim, a store
-- and a release are one script each. Reading a finished record needs no
-- lock, so a duplicate writes nothing, also on a Redis at maxmemory.
--
-- The record's layout is record.lua's (internal/keyspace), which is built
-- in front of this script. A record in state 'forgotten' is read as no
-- record, except for a token, which it keeps spent.
--
-- A token's record is what marks it spent: it outlives the token, so a
-- token with no record has never been spent (or was given back).
--
-- The fencing token is Redis's clock in microseconds at the claim, and
-- always above the key's previous one: storage that remembers the highest
-- token it accepted can refuse a write from an executor whose lease ran out
-- and whose key was taken over.
--
-- Replies: {'claimed', f} run the handler ({'claimed', f, 'retaken',
-- journal} when it takes an abandoned execution over); {'done', record, ttl} replay
-- (ttl: the record's remaining milliseconds);
-- {'unknown'}, {'mismatch'}, {'big'}, {'abandoned'}, {'running', ms} (the
-- lock lapsed, but its executor may still store for ms more: wait),
-- {'held'} (another executor holds the lock: wait), {'corrupt'},
-- {'expired'}.
-- Only 'claimed' leaves our lock held. Running the script again with the
-- same ARGV (go-redis resends when a reply is lost) gives the same reply:
-- a repeated claim answers 'claimed' to the same executor, and every other
-- answer is decided from what the record and the lock say.
local rec = redis.pcall('GET', KEYS[1])
local st, fp, o, f, n, p, q, w, s, j
if rec then
  if type(rec) == 'string' then
    st, fp, o, f, n, p, q, w, s, j = readRecord(rec)
  end
  if not st then
    -- A record this script cannot read (or a hash, as versions before
    -- the string record stored): executed, its answer lost to us.
    return {'corrupt'}
  end
  if st == 'forgotten' and ARGV[4] == '' then
    st = nil
  end
end

-- The lock's value, read by lockHolder where a claim decides by it (a
-- duplicate answered from a finished record never does): nil until then,
-- false when nobody holds the lock.
local holder
local function lockHolder()
  if holder == nil then
    holder = redis.call('GET', KEYS[2])
  end
  return holder
end

-- lease takes the lock for us unless another executor holds it, and
-- reports whether it is ours. It reads the lock before it writes (where a
-- fresh claim sets it with NX, below): a claim resent to a Redis at
-- maxmemory finds its own lock and writes nothing.
local function lease()
  if not lockHolder() then
    redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[7])
    holder = ARGV[1]
  end
  return holder == ARGV[1]
end

-- takeOver claims an abandoned run for us, taking the lock, with a fence
-- above the abandoned one's. The abandoned executor's
-- lock value and token stay on the record, so that undoing this takeover
-- (release.lua) hands the key back to it rather than free: that executor
-- may be stalled, not gone, and still store. Its journal stays too, and
-- comes back with the claim, for the run to resume from. The record lives
-- a record TTL from the takeover, as from a fresh claim: what was left of
-- the abandoned run's (a kept run may be resumed near its end) could run
-- out under the resumed run's steps.
local function takeOver()
  if not lease() then
    return {'held'} -- taking over writes, and writes need our lock
  end
  local t = redis.call('TIME')
  local fence = string.format('%.0f', math.max((tonumber(f) or 0) + 1, tonumber(t[1]) * 1000000 + tonumber(t[2])))
  local journal = string.sub(rec, j)
  redis.call('SET', KEYS[1], recordLine('run', fp, ARGV[1], fence, (tonumber(n) or 1) + 1, o, f, w, s) .. journal,
    'PX', ARGV[3])
  return {'claimed', fence, 'retaken', journal}
end

if st then
  if st == 'run' and o == ARGV[1] then
    if not lease() then
      return {'held'}
    end
    if n ~= '1' then
      -- Our own takeover, resent: it says so again (a fresh claim writes
      -- one execution, and only a takeover adds one).
      return {'claimed', f, 'retaken', string.sub(rec, j)}
    end
    return {'claimed', f}
  end
  local reply
  if st == 'forgotten' then
    reply = {'unknown'}
  elseif fp ~= ARGV[2] then
    reply = {'mismatch'}
  elseif st == 'done' then
    reply = {'done', rec, redis.call('PTTL', KEYS[1])}
  elseif st == 'big' then
    reply = {'big'}
  else
    -- A run under another lock value. Its executor lives exactly as long
    -- as it holds the lock; once nobody holds it under that value, the
    -- execution was abandoned: its lease ran out before it stored an
    -- answer.
    if lockHolder() == o then
      return {'held'} -- that executor holds the key
    end
    if ARGV[5] ~= '1' then
      -- Without a takeover the executor's answer is the key's whenever it
      -- lands, and a lapsed lock does not say the executor is gone: a
      -- stalled Redis lets the lock run out under a live run. Only once
      -- the horizon has passed since the claim (the fence is Redis's clock
      -- then), or the executor said it keeps the key without an answer
      -- (keep.lua marks its lock value with '!'), can nothing store any
      -- more.
      local t = redis.call('TIME')
      local age = tonumber(t[1]) * 1000000 + tonumber(t[2]) - (tonumber(f) or 0)
      if string.sub(o, 1, 1) ~= '!' and age < tonumber(ARGV[6]) * 1000 then
        -- with the milliseconds left until the horizon, when the answer
        -- changes unless the executor stores first
        reply = {'running', string.format('%.0f', tonumber(ARGV[6]) - age / 1000)}
      elseif ARGV[5] == '2' then
        -- Nothing can store for that executor any more: resume its run.
        return takeOver()
      else
        reply = {'abandoned'}
      end
    else
      return takeOver()
    end
  end
  return reply
end
-- No record. An issued token past its expiry can no longer be spent.
local expired = ARGV[4] == 'x'
if ARGV[8] then
  local now = redis.call('TIME')
  expired = tonumber(now[1]) * 1000000 + tonumber(now[2]) >= tonumber(ARGV[8])
end

-- While another executor holds the lock, its claim may still be on its
-- way (an instance of an earlier version takes the lock and claims in two
-- scripts): wait for it. A claim that writes asks by taking the lock
-- (below); a token that cannot be spent asks first.
if (ARGV[4] == 'r' or expired) and lockHolder() and holder ~= ARGV[1] then
  return {'held'}
end
if ARGV[4] == 'r' then
  -- A token of a retired secret is never spent now: only its record could
  -- answer it.
  return {'unknown'}
end

-- An expired token with no record was never spent, and never will be.
if expired then
  return {'expired'}
end

-- The lock's SET is the script's first write: under maxmemory it is
-- refused before anything changed, so a full Redis fails the claim and the
-- handler never starts. It takes the lock only if nobody holds it (SET NX,
-- so a fresh key's lock costs no read); a lock it finds is read: ours, when
-- this claim was resent after its record vanished, or another's on its way.
-- TIME's microseconds are padded to six digits.
if not redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[7]) and lockHolder() ~= ARGV[1] then
  return {'held'}
end
local t = redis.call('TIME')
local fence = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
redis.call('SET', KEYS[1], recordLine('run', ARGV[2], ARGV[1], fence, '1', '', '', '', ''), 'PX', ARGV[3])
return {'claimed', fence}
