-- wrk script: every request a POST with a new Idempotency-Key (first
-- executions). Keys are unique per wrk thread and counter.
local counter = 0
local thread_id = math.random(1, 1e9)
request = function()
  counter = counter + 1
  return wrk.format("POST", nil, {["Idempotency-Key"] = "k-" .. thread_id .. "-" .. counter,
    ["Content-Type"] = "application/json"}, '{"amount":1}')
end
