-- The scout's look at a queue's newest pending tasks (taskrl's scout):
-- those enqueued, or put back, since its last look for a rule, newest
-- first. It reads asynq's own keys and writes only its mark.
--
-- KEYS[1]  asynq's pending list of the queue (the newest task is first)
-- KEYS[2]  the queue's sweep hash (keys.Sweep: asynq's slot); field
--          ARGV[1] = the ID of the newest task the last look saw
-- ARGV[1]  the mark's field
-- ARGV[2]  asynq's task key prefix of the queue
-- ARGV[3]  the most tasks to read
-- ARGV[4]  the most bytes of messages to return
-- ARGV[5]  how long the hash lives at least from now, ms
--
-- Reply: ID, message, ID, message, ... newest first, up to the task the
-- last look saw (not included), ARGV[3] tasks or ARGV[4] bytes (message
-- false for a task whose hash is gone). The mark becomes the newest ID.
local CHUNK = 100
local last = redis.call('HGET', KEYS[2], ARGV[1])
local most, bytes, budget = tonumber(ARGV[3]), 0, tonumber(ARGV[4])
local out = {}
local seen = 0
while seen < most do
  local ids = redis.call('LRANGE', KEYS[1], seen, seen + math.min(CHUNK, most - seen) - 1)
  if #ids == 0 then
    break
  end
  if seen == 0 then
    redis.call('HSET', KEYS[2], ARGV[1], ids[1])
    if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[5]) then
      redis.call('PEXPIRE', KEYS[2], ARGV[5])
    end
  end
  for i = 1, #ids do
    if ids[i] == last then
      return out
    end
    local msg = redis.call('HGET', ARGV[2] .. ids[i], 'msg')
    if msg then
      bytes = bytes + #msg
      if bytes > budget and #out > 0 then
        return out
      end
    end
    out[#out + 1] = ids[i]
    out[#out + 1] = msg
  end
  seen = seen + #ids
  if #ids < CHUNK then
    break
  end
end
return out
