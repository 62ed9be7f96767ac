-- renew.lua: renew our lease, or take a lapsed one back for a run that is
-- still the key's.
-- KEYS[1] record, KEYS[2] lock
-- ARGV[1] our lock value, ARGV[2] the lease in ms, ARGV[3] '1' to take a
-- lapsed lock back, '0' to renew only
-- A stalled Redis lets a live run's lock run out. Where nobody else may
-- take the key over (ARGV[3] '1'), the record still names the run, and its
-- answer will be the key's: holding the lock again makes claims wait for
-- it rather than read it abandoned. Nothing is taken back from a record
-- that names another executor, or none (an operator settled it, or it
-- vanished), nor from a lock someone holds. Returns 1 when the lock is
-- ours for a lease from now, 0 when it is not.
local holder = redis.call('GET', KEYS[2])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return 1
end
if holder then
  return 0
end
if ARGV[3] ~= '1' then
  return 0
end
local rec = redis.call('GET', KEYS[1])
if not rec then
  return 0
end
local st, _, o = readRecord(rec)
if st ~= 'run' or o ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
return 1
