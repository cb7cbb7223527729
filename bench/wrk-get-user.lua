-- GET /api/users/{id}, cycling through the ids of stored users (one per line in the file that
-- USER_IDS names).
dofile("bench/wrk-report.lua")

local ids = {}
for line in io.lines(os.getenv("USER_IDS")) do
  ids[#ids + 1] = line
end
local sent = 0

request = function()
  sent = sent + 1
  return wrk.format("GET", "/api/users/" .. ids[sent % #ids + 1])
end
