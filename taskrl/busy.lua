-- The fleet's worker slots for the shed signal fleet_busy: every process
-- with a shed section publishes its busy and total slots and reads the sum
-- over the fleet. Composed after internal/script/lua/gcra.lua (for
-- gcra_now).
--
-- KEYS[1]  hash: field = process id, value = "busy total at" (at: the
--          server's time in ms when it was written)
-- ARGV[1]  this process's id
-- ARGV[2]  its busy slots
-- ARGV[3]  its total slots (0: it does not know them; not published)
-- ARGV[4]  freshness in ms: older entries (processes that stopped) are
--          removed and not counted; the hash expires after twice that
--
-- Reply: {busy, total} summed over the fresh entries, this one included.
local now = math.floor(gcra_now('-1') / 1000)
local fresh = tonumber(ARGV[4])
if tonumber(ARGV[3]) > 0 then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ' ' .. ARGV[3] .. ' ' .. now)
  redis.call('PEXPIRE', KEYS[1], 2 * fresh)
end
local all = redis.call('HGETALL', KEYS[1])
local busy, total = 0, 0
for i = 1, #all, 2 do
  local b, t, at = string.match(all[i + 1], '^(%d+) (%d+) (%d+)$')
  if b and now - tonumber(at) <= fresh then
    busy, total = busy + tonumber(b), total + tonumber(t)
  else
    redis.call('HDEL', KEYS[1], all[i])
  end
end
return {busy, total}
