-- The pacing queue of one asynq queue: rescheduled tasks waiting for their
-- booked slot, moved to pending a lead before that slot by the
-- middleware's pacers. Composed after internal/script/lua/gcra.lua (for
-- gcra_now).
--
-- KEYS[1]  sorted set: member = asynq task ID, score = booked slot, µs
-- ARGV[1]  op: 0 add, 1 claim
-- ARGV[2]  explicit now in microseconds, or -1 for the server's TIME
-- add:   ARGV[3] task ID, ARGV[4] booked µs, ARGV[5] key TTL floor, ms
-- claim: ARGV[3] most IDs to claim, ARGV[4] lead: claim slots due this many
--        microseconds from now
--
-- Reply: add: 1. claim: the IDs due by now + lead, removed from the set in
-- slot order. Any pacer may claim due IDs; each is handed out once.
local now = gcra_now(ARGV[2])
if ARGV[1] == '0' then
  redis.call('ZADD', KEYS[1], ARGV[4], ARGV[3])
  -- The set lives until a minute after its last slot.
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  local ttl = math.ceil((tonumber(last[2]) - now) / 1000) + 60000
  if ttl < tonumber(ARGV[5]) then ttl = tonumber(ARGV[5]) end
  redis.call('PEXPIRE', KEYS[1], ttl)
  return 1
end
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now + tonumber(ARGV[4])), 'LIMIT', 0, tonumber(ARGV[3]))
if #due > 0 then
  redis.call('ZREM', KEYS[1], unpack(due))
end
return due
