-- The pacer's claim (Pacer.Claim): parked tasks due within a lead leave
-- asynq's scheduled set for its pending list, as asynq's forwarder would
-- move them, with the error message they had before they first waited.
-- A task parked less than a fence ago is claimed only when the caller
-- names it: the worker that parked it knows when asynq is done with that
-- run (its own write after the handler, which must find the task gone
-- from the active list, not back in it). Composed after taskmsg.lua.
--
-- KEYS[1]  the queue's pacing set: member = task ID, score = when to move
--          it (server µs)
-- KEYS[2]  asynq:{q}:scheduled
-- KEYS[3]  asynq:{q}:pending
-- ARGV[1]  explicit now in microseconds, or -1 for the server's TIME
-- ARGV[2]  most IDs to look at
-- ARGV[3]  lead: move tasks due this many microseconds from now
-- ARGV[4]  fence, µs
-- ARGV[5]  asynq's task key prefix of the queue (asynq:{q}:t:)
-- ARGV[6..] IDs the caller parked whose run asynq is done with
--
-- Reply: {looked, moved}: how many due IDs were looked at (ARGV[2]: there
-- may be more), and how many tasks moved. An ID whose task is no longer
-- scheduled (deleted, or moved by asynq's forwarder or by hand) leaves the
-- set without a move.
local now = tm_now(ARGV[1])
local mine = {}
for i = 6, #ARGV do
  mine[ARGV[i]] = true
end
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now + tonumber(ARGV[3])), 'LIMIT', 0, tonumber(ARGV[2]))
local fence, moved = tonumber(ARGV[4]), 0
for _, id in ipairs(due) do
  local key = ARGV[5] .. id
  local parked, msg, saved = unpack(redis.call('HMGET', key, 'taskrl_park', 'msg', 'taskrl_err'))
  if mine[id] or not parked or tonumber(parked) + fence <= now then
    redis.call('ZREM', KEYS[1], id)
    if parked and redis.call('ZREM', KEYS[2], id) == 1 then
      local rest = tm_split(msg, false)
      if rest and saved then
        if saved ~= '' then
          rest = rest .. tm_string(7, saved)
        end
        redis.call('HSET', key, 'msg', rest)
      end
      redis.call('HDEL', key, 'taskrl_park', 'taskrl_err')
      redis.call('HSET', key, 'state', 'pending', 'pending_since', string.format('%d', now * 1000))
      redis.call('LPUSH', KEYS[3], id)
      moved = moved + 1
    end
  end
end
return {#due, moved}
