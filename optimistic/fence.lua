-- fence.lua: write hash fields only for a fencing token not below the one
-- the hash holds, and store the token.
-- KEYS[1] the hash
-- ARGV[1] fence field, ARGV[2] the writer's token (decimal, no leading zero),
-- ARGV[3..] field, value, field, value…
-- Replies {1} when written, {0, stored token} when the token is stale.
--
-- Tokens are compared as decimal strings, never as Lua numbers: those are
-- doubles, exact only up to 2^53, and two tokens a microsecond apart must
-- never compare equal.
local function below(a, b)
  if #a ~= #b then
    return #a < #b
  end
  for i = 1, #a do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      return x < y
    end
  end
  return false
end

local stored = redis.call('HGET', KEYS[1], ARGV[1]) or '0'
local digits = string.match(stored, '^0*(%d+)$')
if not digits then
  return redis.error_reply('fence field ' .. ARGV[1] .. ' is not a decimal token')
end
if below(ARGV[2], digits) then
  return {0, digits}
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2], unpack(ARGV, 3))
return {1}
