-- complete.lua: store the executor's answer and release its lock.
-- KEYS[1] record, KEYS[2] lock, KEYS[3] waiters flag (also the channel)
-- ARGV[1] our lock value, ARGV[2] the record to store: its state (done or
-- big), our claim's fields and the answer; ARGV[3] record TTL ms, ARGV[4]
-- the record as our claim wrote it (state run, the same fields, no answer).
-- The caller builds both texts (keyspace.AppendClaimLine), so that this
-- script compares and stores whole strings rather than building them; the
-- layout is record.lua's.
-- Returns 1 when the answer is stored, 2 when it is stored although the
-- record had vanished while the handler ran (evicted, expired, flushed), and
-- 0 when another executor owns the key now, or an operator settled it
-- (then nothing is written). Our lock is released whatever the answer. Safe
-- to run twice.
local rec = redis.call('GET', KEYS[1])
local stored, text = 0, nil
if rec == ARGV[4] then
  -- The record as our claim left it: the common case. Nobody else can
  -- hold the lock then (every script that takes it for another executor
  -- writes that executor into the record in the same step: a takeover), so
  -- it is ours or lapsed, and goes without a read.
  stored, text = 1, ARGV[2]
else
  local st, fp, o, f, n, p, q, w, s
  if rec then
    st, fp, o, f, n, p, q, w, s = readRecord(rec)
    -- A record this version cannot read (one of a later version's layout,
    -- say) is not ours: nothing is written over it.
    st = st or 'unreadable'
  end
  -- Our answer, and the line it is stored under.
  local ourState, ourFP, ourOwner, ourFence, ourExecutions, _, _, _, _, answer = readRecord(ARGV[2])
  if not st or st == 'forgotten' then
    -- No record is claimed now (a claim writes one; an operator forgot the
    -- claim, taking our executor for gone), so our answer is the key's:
    -- writing it back keeps a retry from running the handler a second
    -- time. The written-back field tells a resend that it was.
    stored, text = 2, recordLine(ourState, ourFP, ourOwner, ourFence, ourExecutions, '', '', '1', '') ..
      string.sub(ARGV[2], answer)
  elseif o == ARGV[1] then
    stored = 1
    if w ~= '' then
      stored = 2
    end
    if st == 'run' then
      -- Ours after a takeover: the record keeps its own fields.
      text = recordLine(ourState, fp, o, f, n, p, q, w, s) .. string.sub(ARGV[2], answer)
    end
  end
end
if text then
  -- The handler has run: its answer must be kept even if Redis reached
  -- maxmemory meanwhile. Redis refuses a memory-growing command only in a
  -- script that has not written yet, so a write that cannot grow memory
  -- goes before the SET: the lock's DEL (read first unless the record
  -- was as our claim left it, above) or, when the lock is no longer ours,
  -- a PEXPIRE of the record.
  if rec == ARGV[4] or redis.call('GET', KEYS[2]) == ARGV[1] then
    redis.call('DEL', KEYS[2])
  else
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
  end
  redis.call('SET', KEYS[1], text, 'PX', ARGV[3])
elseif redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
end
-- Only a key that another instance is waiting for costs a message.
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('PUBLISH', KEYS[3], 'done')
end
return stored
