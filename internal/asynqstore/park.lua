-- Parks a task that must wait for its limits, in place: the task a worker
-- is running (asynq's active list) becomes a scheduled task of asynq's
-- again, under the same ID, hash, unique lock and retry count, with
-- the reason it waits as its error message (asynq's TaskInfo.LastErr)
-- and the middleware's state in its taskrl-* headers. asynq's own write
-- after the handler returns (Done, MarkAsComplete) then finds the task
-- gone from the active list and changes nothing: no counter moves.
-- Composed after taskmsg.lua.
--
-- KEYS[1]  asynq:{q}:active
-- KEYS[2]  asynq:{q}:lease
-- KEYS[3]  asynq:{q}:scheduled
-- KEYS[4]  asynq:{q}:t:ID, the task's hash
-- KEYS[5]  the queue's pacing set (keys.Pace: asynq's hash tag)
-- ARGV[1]  the task ID
-- ARGV[2]  the new fields: error_msg and the taskrl-* header entries,
--          encoded (Wait.fields)
-- ARGV[3]  when asynq's forwarder moves it to pending if no pacer does
--          (Unix seconds of the worker's clock, as asynq scores it)
-- ARGV[4]  when the pacer moves it (server µs), or -1: not paced
-- ARGV[5]  the pacing set's expiry (Unix ms)
--
-- Reply: 1 parked; 0 the task is not active any more (its lease ended and
-- asynq's recoverer took it back, or it is gone): nothing changed; -1 its
-- message does not parse: nothing changed.
if redis.call('LREM', KEYS[1], 0, ARGV[1]) == 0 then
  return 0
end
local msg, saved = unpack(redis.call('HMGET', KEYS[4], 'msg', 'taskrl_err'))
local rest, err = tm_split(msg or '', true)
if not msg or not rest then
  redis.call('RPUSH', KEYS[1], ARGV[1]) -- as it was (order does not matter)
  return -1
end
redis.call('ZREM', KEYS[2], ARGV[1])
-- The error the task had before it first waited, given back when it is
-- moved to pending (unpark.lua).
if not saved then
  redis.call('HSET', KEYS[4], 'taskrl_err', err)
end
redis.call('HSET', KEYS[4], 'msg', rest .. ARGV[2], 'state', 'scheduled',
  'taskrl_park', string.format('%d', tm_now(-1)))
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
if tonumber(ARGV[4]) >= 0 then
  redis.call('ZADD', KEYS[5], ARGV[4], ARGV[1])
  redis.call('PEXPIREAT', KEYS[5], ARGV[5], 'NX')
  redis.call('PEXPIREAT', KEYS[5], ARGV[5], 'GT')
end
return 1
