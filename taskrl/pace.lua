-- The pacing queue of one asynq queue: rescheduled tasks waiting for their
-- booked slot, moved to pending a lead before that slot by the
-- middleware's pacers (which add to it with ZADD, pacer.add). Composed
-- after internal/script/lua/gcra.lua (for gcra_now).
--
-- KEYS[1]  sorted set: member = asynq task ID, score = booked slot, µs
-- ARGV[1]  explicit now in microseconds, or -1 for the server's TIME
-- ARGV[2]  most IDs to claim
-- ARGV[3]  lead: claim slots due this many microseconds from now
--
-- Reply: the IDs due by now + lead, removed from the set in slot order.
-- Any pacer may claim due IDs; each is handed out once.
local now = gcra_now(ARGV[1])
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now + tonumber(ARGV[3])), 'LIMIT', 0, tonumber(ARGV[2]))
if #due > 0 then
  redis.call('ZREM', KEYS[1], unpack(due))
end
return due
