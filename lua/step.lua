-- step.lua: journal one step of a run with the key's record, under the
-- run's fence.
-- KEYS[1] record
-- ARGV[1] our lock value, ARGV[2] the step's entry (journal.go lays it
-- out), ARGV[3] how long the journal was before it, in bytes
-- The journal follows the line of a run's record (claim.lua's layout): a
-- takeover keeps it, and the store of the answer, a release or an
-- operator's settle drops it with the rest of the record. Only the run the
-- record names may write it: an executor whose key was taken over, settled
-- or kept (its lock value marked '!') journals nothing.
-- Returns 1 when the entry is journaled, also when a resend finds it is
-- already; 0 when the record no longer names our run (nothing written).
-- A step reads the record's line and, for a resend, its own entry, never
-- the whole journal: what one costs Redis (which runs one script at a
-- time) does not grow with the steps before it.
local size = redis.call('STRLEN', KEYS[1])
if size == 0 then
  return 0
end
local head = redis.call('GETRANGE', KEYS[1], 0, 1023)
if not string.find(head, '\n', 1, true) then
  head = redis.call('GET', KEYS[1]) -- a line longer than our scripts write: read it whole
end
local o, j = string.match(head, '^run [^ ]* ([^ ]*) [^\n]*\n()')
if o ~= ARGV[1] then
  return 0
end
local before, at = size - j + 1, tonumber(ARGV[3])
if before == at then
  -- APPEND keeps the record's TTL: the journal lives exactly as long.
  redis.call('APPEND', KEYS[1], ARGV[2])
  return 1
end
if before == at + #ARGV[2] and redis.call('GETRANGE', KEYS[1], j - 1 + at, -1) == ARGV[2] then
  return 1 -- ours, resent after a lost reply
end
return 0
