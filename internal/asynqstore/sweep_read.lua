-- The sweep's look at a queue's oldest pending tasks (sweeper.sweep),
-- under the queue's sweep lock: one sweeper at a time reads and moves a
-- queue's tasks. It reads asynq's own keys. Composed after taskmsg.lua.
--
-- KEYS[1]  asynq's pending list of the queue (the oldest task is last)
-- KEYS[2]  the queue's sweep hash (keys.Sweep: asynq's slot); field
--          "lock" = holder token, a space, until when it holds (µs)
-- ARGV[1]  explicit now in microseconds, or -1 for the server's TIME
-- ARGV[2]  the caller's token
-- ARGV[3]  how long the caller holds the lock from now, µs; 0 gives it up
-- ARGV[4]  asynq's task key prefix of the queue
-- ARGV[5]  offset: how many of the oldest to skip
-- ARGV[6]  window: the most tasks to read
-- ARGV[7]  the fewest pending tasks worth a sweep
-- ARGV[8]  the most bytes of messages to return
--
-- Reply: false when another sweeper holds the lock; {} when the lock was
-- given up or fewer than ARGV[7] tasks are pending; else 1 if the window
-- was full (ARGV[6] tasks, or ARGV[8] bytes: the tasks that fit) or 0 if
-- it was the last, then ID, message, ID, message, ... oldest first
-- (message false for a task whose hash is gone, or that a sweep set aside
-- once already: it decides when it comes back, and is not moved again).
local now = tm_now(ARGV[1])
local lock = redis.call('HGET', KEYS[2], 'lock')
local mine = true
if lock then
  local holder, till = string.match(lock, '^(%S+) (%d+)$')
  mine = holder == ARGV[2] or tonumber(till) <= now
end
if not mine then
  return false
end
if tonumber(ARGV[3]) == 0 then
  if lock then
    redis.call('HDEL', KEYS[2], 'lock')
  end
  return {}
end
if redis.call('LLEN', KEYS[1]) < tonumber(ARGV[7]) then
  return {}
end
redis.call('HSET', KEYS[2], 'lock', ARGV[2] .. ' ' .. string.format('%d', now + tonumber(ARGV[3])))
if redis.call('PTTL', KEYS[2]) < 0 then
  redis.call('PEXPIRE', KEYS[2], 60000)
end
local off, win = tonumber(ARGV[5]), tonumber(ARGV[6])
local ids = redis.call('LRANGE', KEYS[1], -(off + win), -(off + 1))
local out = {#ids == win and 1 or 0}
local bytes, most = 0, tonumber(ARGV[8])
for i = #ids, 1, -1 do
  local msg, swept = unpack(redis.call('HMGET', ARGV[4] .. ids[i], 'msg', 'taskrl_swept'))
  if swept then
    msg = false
  end
  if msg then
    bytes = bytes + #msg
    if bytes > most and #out > 1 then
      out[1] = 1
      break
    end
  end
  out[#out + 1] = ids[i]
  out[#out + 1] = msg
end
return out
