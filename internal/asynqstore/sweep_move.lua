-- The sweep's move (sweeper.sweep): the tasks of noted backlogs leave
-- asynq's pending list for its scheduled set, each due a lead before the
-- slot it is estimated to get, in one step; the others keep their order.
-- It writes asynq's own keys as asynq's scheduler does
-- : the task hash's state becomes "scheduled", and
-- asynq's forwarder moves the task back to pending when due. Each
-- backlog's estimate continues from a cursor the whole fleet shares.
-- Composed after taskmsg.lua.
--
-- KEYS[1]  asynq's pending list of the queue
-- KEYS[2]  asynq's scheduled set of the queue
-- KEYS[3]  the queue's sweep hash (keys.Sweep): the lock (sweep_read.lua)
--          and, per backlog signature, the estimated slot of its next
--          task (µs)
-- ARGV[1]  explicit now in microseconds, or -1 for the server's TIME
-- ARGV[2]  the caller's token: nothing moves unless it holds the lock
-- ARGV[3]  asynq's task key prefix of the queue
-- ARGV[4]  how many of the oldest pending IDs to look through
-- ARGV[5]  the caller's clock minus the server's, µs (asynq scores due
--          times in Unix seconds of the workers' clocks)
-- ARGV[6]  lead: a task is due this long before its estimated slot, µs
-- ARGV[7]  a task whose estimated slot is sooner than this from now stays
--          pending, µs
-- ARGV[8]  G, the number of backlogs
-- ARGV[9..] G triples: signature, earliest slot of its first task (µs),
--          spacing between its tasks (µs); then triples: task ID, its
--          backlog (1..G), its deadline (Unix seconds, 0: none)
--
-- Reply: how many tasks moved, or false when the caller does not hold the
-- lock. Tasks are taken oldest first; each one of a backlog still pending
-- takes the backlog's next estimated slot (moved or not: one due soon, or
-- with a deadline before its slot, stays and runs first); a listed task no
-- longer pending (a worker took it) takes none. The hash lives a minute
-- past its last cursor; cursors that have passed are dropped once it has
-- over 256 fields.
local now = tm_now(ARGV[1])
local lock = redis.call('HGET', KEYS[3], 'lock')
if not lock or string.match(lock, '^(%S+) ') ~= ARGV[2] then
  return false
end
local skew, lead, soon = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local G = tonumber(ARGV[8])
local sig, cursor, spacing = {}, {}, {}
for g = 1, G do
  local i = 9 + (g - 1) * 3
  sig[g] = ARGV[i]
  cursor[g] = math.max(tonumber(redis.call('HGET', KEYS[3], ARGV[i]) or 0), tonumber(ARGV[i + 1]))
  spacing[g] = tonumber(ARGV[i + 2])
end
local task = {}
for i = 9 + G * 3, #ARGV, 3 do
  task[ARGV[i]] = {tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])}
end
local tail = redis.call('LRANGE', KEYS[1], -tonumber(ARGV[4]), -1)
local moving, moved = {}, 0
for k = #tail, 1, -1 do -- oldest first
  local id = tail[k]
  local t = task[id]
  if t then
    task[id] = nil
    local g = t[1]
    local slot = cursor[g]
    cursor[g] = slot + spacing[g]
    local due = slot - lead
    if slot - now >= soon and (t[2] == 0 or t[2] * 1000000 >= slot) then
      moving[k] = true
      redis.call('ZADD', KEYS[2], math.floor((due + skew) / 1000000), id)
      redis.call('HSET', ARGV[3] .. id, 'state', 'scheduled', 'taskrl_swept', '1')
      redis.call('HDEL', ARGV[3] .. id, 'pending_since')
      moved = moved + 1
    end
  end
end
if moved > 0 then
  local kept = {}
  for k = 1, #tail do
    if not moving[k] then
      kept[#kept + 1] = tail[k]
    end
  end
  redis.call('LTRIM', KEYS[1], 0, -(#tail + 1))
  for i = 1, #kept, 1000 do
    redis.call('RPUSH', KEYS[1], unpack(kept, i, math.min(i + 999, #kept)))
  end
end
local last = now
for g = 1, G do
  redis.call('HSET', KEYS[3], sig[g], string.format('%d', cursor[g]))
  last = math.max(last, cursor[g])
end
if redis.call('HLEN', KEYS[3]) > 256 then
  local all = redis.call('HGETALL', KEYS[3])
  for i = 1, #all, 2 do
    if all[i] ~= 'lock' and tonumber(all[i + 1]) < now then
      redis.call('HDEL', KEYS[3], all[i])
    end
  end
end
local ttl = math.ceil((last - now) / 1000) + 60000
if redis.call('PTTL', KEYS[3]) < ttl then
  redis.call('PEXPIRE', KEYS[3], ttl)
end
return moved
