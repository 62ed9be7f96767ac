-- settle.lua: an operator settles an interrupted key: stores a committed
-- answer as its record, or forgets the record so that a retry runs again.
-- KEYS[1] record, KEYS[2] lock, KEYS[3] waiters flag (also the channel)
-- ARGV[1] 'answer' or 'forget', ARGV[2] the lock value of the claim the
-- operator inspected, ARGV[3] record TTL ms, used only when the record has
-- none, ARGV[4] the claim horizon in ms; for 'answer': ARGV[5] state
-- ('done', or 'big' for an answer over the response limit), ARGV[6] status,
-- ARGV[7] headers, ARGV[8] body, ARGV[9] fingerprint in hex ('' keeps the
-- record's)
--
-- It acts only while the key is interrupted, the state claim.lua calls
-- abandoned: claimed (state run) under a lock value that nobody holds the
-- lock with, and either kept by its run or claimed longer ago than the
-- claim horizon (before that, its executor may be live, its lock lapsed
-- under a stalled Redis or a paused process, and still store its answer).
-- Checking inside the script is what makes it safe: a claim, a store or a
-- takeover that runs just before sees its own result kept, one that runs
-- just after sees the settled record.
--
-- The record's layout is record.lua's. A
-- settled record names what settled it (its last field) and no executor
-- (an empty lock value): the executor of that claim, stalled rather than
-- gone, finds the key no longer its own when it wakes and stores nothing
-- (complete.lua), so the key keeps one answer. What settled it is this
-- script's mark: the mode, for an answer 16 hex digits of a SHA-1 of
-- everything it stored, and the claim's lock value. A resend of this script with the same ARGV (go-redis resends
-- when a reply is lost) finds its own mark on the record it left and
-- answers 'settled' again; any other call is decided from what the record
-- says now, so that a Resolve after a Forget, a Forget after a Resolve or a
-- second Resolve with another answer is refused, never reported done. The
-- mark counts only on the record as this script left it: a claim that
-- takes a forgotten key anew writes a record of its own. Forget leaves state
-- 'forgotten', which a claim reads as no record at all.
-- Replies: 'settled', or why not: 'none' (no record, or a forgotten one),
-- 'corrupt' (a record it cannot read),
-- 'done', 'big' (an answer is stored), 'running' (the executor holds its
-- lock), 'young' (its lock lapsed, but the claim horizon has not passed),
-- 'mismatch' (the answer is another request's), 'changed' (claimed anew
-- since the operator looked: that claim may be running, stalled past its
-- lease).
local rec = redis.pcall('GET', KEYS[1])
local st, fp, o, f, n, p, q, w, s
if type(rec) == 'string' then
  st, fp, o, f, n, p, q, w, s = readRecord(rec)
  if not st then
    return 'corrupt'
  end
elseif rec then
  return 'corrupt'
end
local mark, left
if ARGV[1] == 'forget' then
  mark, left = 'f:' .. ARGV[2], 'forgotten'
else
  local parts = {}
  for i = 5, 9 do
    parts[#parts + 1] = #ARGV[i] .. ':' .. ARGV[i]
  end
  mark, left = 'a:' .. string.sub(redis.sha1hex(table.concat(parts)), 1, 16) .. ':' .. ARGV[2], ARGV[5]
end
if st == left and s == mark then
  return 'settled'
end
if not st or st == 'forgotten' then
  return 'none'
end
if st ~= 'run' then
  return st
end
if redis.call('GET', KEYS[2]) == o then
  return 'running'
end
if o ~= ARGV[2] then
  return 'changed'
end
if string.sub(o, 1, 1) ~= '!' then
  local t = redis.call('TIME')
  if tonumber(t[1]) * 1000000 + tonumber(t[2]) - (tonumber(f) or 0) < tonumber(ARGV[4]) * 1000 then
    return 'young'
  end
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl <= 0 then
  ttl = ARGV[3]
end
if ARGV[1] == 'forget' then
  -- A token-mode key's token is not given back: its retry is answered
  -- token-not-found and fetches a new token, as after any spent token,
  -- rather than a form's token coming back to life hours later.
  -- DEL first: under maxmemory a script that has written may grow memory.
  redis.call('DEL', KEYS[1])
  redis.call('SET', KEYS[1], recordLine('forgotten', '', '', '', '', '', '', '', mark), 'PX', ttl)
else
  if ARGV[9] ~= '' and ARGV[9] ~= fp then
    return 'mismatch'
  end
  -- The fence and the executions stay; the executor goes. SET first: under
  -- maxmemory it is refused before anything else ran.
  redis.call('SET', KEYS[1], recordLine(ARGV[5], fp, '', f, n, p, q, w, mark) .. answerText(ARGV[6], ARGV[7], ARGV[8]),
    'PX', ttl)
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('PUBLISH', KEYS[3], 'settled')
end
return 'settled'
