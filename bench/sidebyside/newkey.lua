-- Every request a POST with a key no other request of the run has (first
-- executions). The key prefix comes after "--" on wrk's command line and
-- differs per run, so that no run replays another's keys; each thread
-- numbers its own.
local prefix = "k-"
local counter = 0
local threads = 0

function setup(thread)
  threads = threads + 1
  thread:set("thread_id", threads)
end

function init(args)
  prefix = (args[1] or prefix) .. (thread_id or 1) .. "-"
end

function request()
  counter = counter + 1
  return wrk.format("POST", nil, {["Idempotency-Key"] = prefix .. counter,
    ["Content-Type"] = "application/json"}, '{"amount":1}')
end
