-- wrk script: every request repeats one key (duplicates, all connections
-- at once).
request = function()
  return wrk.format("POST", nil, {["Idempotency-Key"] = "same",
    ["Content-Type"] = "application/json"}, '{"amount":1}')
end
