-- Every request a POST repeating one key, named after "--" on wrk's
-- command line (duplicates, all connections at once).
local req

function init(args)
  req = wrk.format("POST", nil, {["Idempotency-Key"] = args[1] or "same",
    ["Content-Type"] = "application/json"}, '{"amount":1}')
end

function request()
  return req
end
