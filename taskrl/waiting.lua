-- The index of waiting tasks (waiting.go): per rule and key, a sorted set
-- of the tasks the middleware rescheduled, scored by when each is due.
-- Composed after internal/script/lua/gcra.lua (for gcra_now, fmt).
--
-- KEYS     the sets (keys.Waiting), all of one key, so in one slot
-- ARGV[1]  "add" or "count"
-- ARGV[2]  add: the task ID
-- ARGV[3]  add: when it is due, µs on the server's clock
--
-- Reply: add: 0, the task added (or moved) in every set, each of which
-- then drops the tasks due before now and lives a minute after its last
-- task is due; count: per set, the tasks due after now.
local now = gcra_now('-1')
if ARGV[1] == 'count' then
  local out = {}
  for i, k in ipairs(KEYS) do out[i] = call('ZCOUNT', k, '(' .. fmt(now), '+inf') end
  return out
end
local due = tonumber(ARGV[3])
for _, k in ipairs(KEYS) do
  call('ZADD', k, fmt(due), ARGV[2])
  call('ZREMRANGEBYSCORE', k, '-inf', fmt(now))
  local ttl = ttl_ms(due - now, 0) + 60000
  if call('PTTL', k) < ttl then call('PEXPIRE', k, fmt(ttl)) end
end
return 0
