-- step.lua: prove that a run still owns its key, and journal one step of
-- it with the key's record, under the run's fence.
-- KEYS[1] record, KEYS[2] lock
-- ARGV[1] our lock value, ARGV[2] the step's entry (journal.go lays it
-- out; '' to prove ownership only, before a step runs), ARGV[3] how long
-- the journal was before it, in bytes, ARGV[4] the lease in ms, to take a
-- lapsed lock back while the record names our run ('' where another
-- executor may take the key over as soon as the lock lapses: renew.lua's
-- rule)
-- The journal follows the line of a run's record (record.lua's layout): a
-- takeover keeps it, and the store of the answer, a release or an
-- operator's settle drops it with the rest of the record. Only the run the
-- record names may write it: an executor whose key was taken over, settled
-- or kept (its lock value marked '!') journals nothing.
-- Returns {code, ms}: code 1 when the record names our run (the entry is
-- journaled, also when a resend finds it is already), 0 when it names
-- another or none (nothing written), -1 when there is no record (it
-- vanished: expired, evicted, flushed); ms how long our lock has left (0
-- when the lock is not ours): until then nobody else can take the key, so
-- the run may start its next step without asking again.
-- A step reads the record's line and, for a resend, its own entry, never
-- the whole journal: what one costs Redis (which runs one script at a
-- time) does not grow with the steps before it.
local function lockLeft(ours)
  local holder = redis.call('GET', KEYS[2])
  if holder == ARGV[1] then
    return redis.call('PTTL', KEYS[2])
  end
  if ours and not holder and ARGV[4] ~= '' then
    redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[4])
    return tonumber(ARGV[4])
  end
  return 0
end

local size = redis.call('STRLEN', KEYS[1])
if size == 0 then
  return {-1, lockLeft(false)}
end
local head = redis.call('GETRANGE', KEYS[1], 0, 1023)
if not string.find(head, '\n', 1, true) then
  head = redis.call('GET', KEYS[1]) -- a line longer than our scripts write: read it whole
end
local st, _, o, _, _, _, _, _, _, j = readRecord(head)
if st ~= 'run' or o ~= ARGV[1] then
  return {0, 0}
end
if ARGV[2] == '' then
  return {1, lockLeft(true)}
end
local before, at = size - j + 1, tonumber(ARGV[3])
if before == at then
  -- APPEND keeps the record's TTL: the journal lives exactly as long.
  redis.call('APPEND', KEYS[1], ARGV[2])
  return {1, lockLeft(true)}
end
if before == at + #ARGV[2] and redis.call('GETRANGE', KEYS[1], j - 1 + at, -1) == ARGV[2] then
  return {1, lockLeft(true)} -- ours, resent after a lost reply
end
return {0, 0}
