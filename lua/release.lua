-- release.lua: undo a claim whose run must not count as executed (nothing
-- of it can take effect any more: see lifecycle.go), so a retry runs.
-- KEYS[1] record, KEYS[2] lock, KEYS[3] waiters flag (also the channel)
-- ARGV[1] our lock value
-- An issued token's record is what marks it spent, so deleting the record
-- gives the token back until it expires. A takeover is undone by handing
-- the key back to the executor it was taken from. Only a fresh claim's
-- record goes: one that earlier executors left is kept. The record's
-- layout is record.lua's.
local rec = redis.call('GET', KEYS[1])
if rec then
  local st, fp, o, f, n, p, q, w, s, j = readRecord(rec)
  if st == 'run' and o == ARGV[1] then
    if p ~= '' then
      -- Our claim took the key over from an executor whose lease had run
      -- out. Undoing it frees nothing: the key goes back to that executor,
      -- which may have taken effect and may still store its answer; the
      -- next retry finds it abandoned again.
      -- The steps it journaled stay with it (step.lua).
      redis.call('SET', KEYS[1], recordLine('run', fp, p, q, n, '', '', w, s) .. string.sub(rec, j), 'KEEPTTL')
    elseif n == '1' and j > #rec then
      redis.call('DEL', KEYS[1])
    else
      -- A run that took effect before ours: a takeover handed back to us
      -- by the undo of a takeover of ours (the record names one previous
      -- owner only), or steps journaled. Deleting it would drop its
      -- journal, and let a fresh claim run what was done as if nothing
      -- had; instead it is kept as nothing can store for it any more, and
      -- the next claim takes it over, journal and all (keep.lua's mark).
      redis.call('SET', KEYS[1], recordLine('run', fp, '!' .. o, f, n, p, q, w, s) .. string.sub(rec, j), 'KEEPTTL')
    end
  end
end
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('PUBLISH', KEYS[3], 'released')
end
return 1
