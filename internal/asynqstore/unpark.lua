-- The pacer's claim (Pacer.Claim): parked tasks due within a lead leave
-- asynq's scheduled set for its pending list, as asynq's forwarder would
-- move them, with the error message they had before they first waited.
--
-- Where in the list: the lead is for idle workers, which look at their
-- queues only now and then. A task due within the busy lead goes to the
-- head of the list (the end asynq's workers take from): its capacity is
-- booked, and behind tasks not yet decided it would start late and leave
-- that capacity unused. A task due later goes to the tail, as asynq's
-- forwarder puts a task: at the head it would hold a worker until its
-- slot while the tasks behind it wait to be decided. If other tasks were
-- pending, it is noted in the early set, and the first claim once it is
-- due within the promotion window moves it to the head if no worker has
-- taken it yet. Tasks an earlier claim put at the head that no worker has
-- taken yet stay ahead (up to AHEAD of them; beyond that the new ones go
-- first).
--
-- A task parked less than a fence ago is claimed only when the caller
-- names it: the worker that parked it knows when asynq is done with that
-- run (its own write after the handler, which must find the task gone
-- from the active list, not back in it). Composed after taskmsg.lua.
--
-- KEYS[1]  the queue's pacing set: member = task ID, score = when to move
--          it (server µs)
-- KEYS[2]  asynq:{q}:scheduled
-- KEYS[3]  asynq:{q}:pending
-- KEYS[4]  the ID of the task the last claim put deepest in pending
--          (keys.Moved), kept KEEP
-- KEYS[5]  the early set: member = ID of a task moved to the tail, score
--          = its slot (server µs); kept KEEP past its latest slot
-- ARGV[1]  explicit now in microseconds, or -1 for the server's TIME
-- ARGV[2]  most IDs to look at, in the pacing set and in the early set
-- ARGV[3]  lead: move tasks due this many microseconds from now
-- ARGV[4]  busy lead, µs
-- ARGV[5]  promotion window, µs
-- ARGV[6]  fence, µs
-- ARGV[7]  asynq's task key prefix of the queue (asynq:{q}:t:)
-- ARGV[8..] IDs the caller parked whose run asynq is done with
--
-- Reply: {looked, moved, noted}: how many due IDs were looked at (ARGV[2]:
-- there may be more), how many tasks moved, and how many of them were
-- noted in the early set. An ID whose task is no longer
-- scheduled (deleted, or moved by asynq's forwarder or by hand) leaves the
-- set without a move.
local AHEAD, KEEP = 500, 600000
local now = tm_now(ARGV[1])
local most, soon = tonumber(ARGV[2]), now + tonumber(ARGV[4])
local mine = {}
for i = 8, #ARGV do
  mine[ARGV[i]] = true
end
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now + tonumber(ARGV[3])), 'WITHSCORES', 'LIMIT', 0, most)
local fence, head, tail, noted, last = tonumber(ARGV[6]), {}, 0, 0, now
local others = redis.call('LLEN', KEYS[3]) > 0
for i = 1, #due, 2 do
  local id, at = due[i], tonumber(due[i + 1])
  local key = ARGV[7] .. id
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
      if at <= soon then
        head[#head + 1] = {at, id}
      else
        redis.call('LPUSH', KEYS[3], id)
        tail = tail + 1
        if others then
          redis.call('ZADD', KEYS[5], string.format('%d', at), id)
          noted, last = noted + 1, math.max(last, at)
        end
      end
    end
  end
end
local moved = #head + tail
if noted > 0 and redis.call('PTTL', KEYS[5]) < math.ceil((last - now) / 1000) + KEEP then
  redis.call('PEXPIRE', KEYS[5], math.ceil((last - now) / 1000) + KEEP)
end
-- Tasks moved to the tail, due within the promotion window, that no
-- worker has taken.
local early = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', string.format('%d', now + tonumber(ARGV[5])), 'WITHSCORES', 'LIMIT', 0, most)
for i = 1, #early, 2 do
  local id = early[i]
  redis.call('ZREM', KEYS[5], id)
  if redis.call('HGET', ARGV[7] .. id, 'state') == 'pending' and redis.call('LREM', KEYS[3], -1, id) == 1 then
    head[#head + 1] = {tonumber(early[i + 1]), id}
  end
end
if #head == 0 then
  return {#due / 2, moved, noted}
end
-- Tasks an earlier claim put at the head that no worker has taken yet,
-- from the one it put deepest to the head (asynq's workers take from the
-- right), stay there.
local front = {}
local deepest = redis.call('GET', KEYS[4])
if deepest and redis.call('HGET', ARGV[7] .. deepest, 'state') == 'pending' then
  local at = redis.call('LPOS', KEYS[3], deepest, 'RANK', -1, 'MAXLEN', AHEAD)
  if at then
    front = redis.call('RPOP', KEYS[3], redis.call('LLEN', KEYS[3]) - at)
  end
end
table.sort(head, function(a, b) return a[1] < b[1] end)
for i = #head, 1, -1 do
  redis.call('RPUSH', KEYS[3], head[i][2])
end
for i = #front, 1, -1 do
  redis.call('RPUSH', KEYS[3], front[i])
end
redis.call('SET', KEYS[4], head[#head][2], 'PX', KEEP)
return {#due / 2, moved, noted}
