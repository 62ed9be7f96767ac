-- keep.lua: end a run whose outcome cannot be known, keeping its claim.
-- KEYS[1] record, KEYS[2] lock
-- ARGV[1] our lock value
-- The record stays claimed, its owner marked kept ('!' before our lock
-- value), and our lock is freed. Without the mark, a claim that finds the
-- lock gone waits out the claim horizon (claim.lua), since the executor
-- might still store; a kept run never will, so its key reads interrupted
-- (or is taken over) at once. The record's layout is record.lua's. Safe to
-- run twice.
local rec = redis.call('GET', KEYS[1])
if rec then
  local st, fp, o, f, n, p, q, w, s, j = readRecord(rec)
  if st == 'run' and o == ARGV[1] then
    redis.call('SET', KEYS[1], recordLine(st, fp, '!' .. o, f, n, p, q, w, s) .. string.sub(rec, j), 'KEEPTTL')
  end
end
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
end
return 1
