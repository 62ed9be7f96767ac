-- cas.lua: write hash fields only if the hash is at the expected version,
-- and increment the version.
-- KEYS[1] the hash
-- ARGV[1] version field, ARGV[2] expected version (decimal; '0': the hash
-- must not exist yet), ARGV[3..] field, value, field, value…
-- Replies {1, new version} when written, {0, current version, exists}
-- when not (exists is 1 or 0).
--
-- Versions travel as strings: a Lua number is a double, and a version past
-- 2^53 would come back rounded.
local exists = redis.call('EXISTS', KEYS[1])
local current = redis.call('HGET', KEYS[1], ARGV[1])
if exists == 1 and not current then
  return redis.error_reply('hash has no version field ' .. ARGV[1])
end
if (current or '0') ~= ARGV[2] then
  return {0, current or '0', exists}
end
if #ARGV > 2 then
  redis.call('HSET', KEYS[1], unpack(ARGV, 3))
end
redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
return {1, redis.call('HGET', KEYS[1], ARGV[1])}
