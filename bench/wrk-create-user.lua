-- POST /api/users, each with an e-mail no other request of the run uses (RUN_TAG, the thread,
-- a counter), so every answer should be a 201.
dofile("bench/wrk-report.lua")

local threads = 0
setup = function(thread)
  threads = threads + 1
  thread:set("thread_number", threads)
end

local run = os.getenv("RUN_TAG") or tostring(os.time())
local sent = 0

request = function()
  sent = sent + 1
  local body = string.format('{"name":"Bench %d","email":"bench-%s-%d-%d@example.com"}',
    sent, run, thread_number, sent)
  return wrk.format("POST", "/api/users", { ["Content-Type"] = "application/json" }, body)
end
