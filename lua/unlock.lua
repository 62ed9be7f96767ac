-- unlock.lua: let our lock go, and leave the key's record as it is.
-- KEYS[1] lock
-- ARGV[1] our lock value
-- For a lease that ends without a store, a release or a keep (an answer
-- that cannot be replayed, a journal that cannot be read): the next claim
-- decides from the record. Nothing is done to a lock another executor
-- holds. Safe to run twice.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
end
return 1
