-- inspect.lua: read what Redis holds for one key in one step, so that an
-- operator never sees a record from before a store and a lock from after it.
-- KEYS[1] record, KEYS[2] lock, KEYS[3] waiters flag
-- The record's layout is record.lua's.
-- Reply: {state, executor's lock value, fingerprint, status, executions,
-- fence, body length, record PTTL, lock value, lock PTTL, waiters flag
-- exists, TIME's seconds, TIME's microseconds}; '' for what is missing (a
-- Lua false would end the reply array early), and the state 'corrupt' for
-- a record it cannot read. Redis's clock tells how old the claim is, by
-- its fence.
local rec = redis.pcall('GET', KEYS[1])
local st, fp, o, f, n, c, hl, at = '', '', '', '', '', '', 0, 0
if type(rec) == 'table' then
  rec = '' -- not a string: a hash, as versions before the string record stored
end
if rec then
  local _, meta
  st, fp, o, f, n, _, _, _, _, meta = readRecord(rec)
  if st then
    c, hl, at = readAnswer(rec, meta)
  else
    st, fp, o, f, n = 'corrupt', '', '', '', ''
  end
  c = c or ''
end
local size = 0
if at and at > 0 then
  size = #rec - at + 1 - tonumber(hl)
end
-- A lock that is not a string (another program's key under the prefix)
-- reads as no lock, rather than failing a walk of every key.
local lock = redis.pcall('GET', KEYS[2])
if type(lock) ~= 'string' then
  lock = ''
end
local t = redis.call('TIME')
return {st, o, fp, c, n, f, size, redis.call('PTTL', KEYS[1]),
  lock, redis.call('PTTL', KEYS[2]),
  redis.call('EXISTS', KEYS[3]), t[1], t[2]}
