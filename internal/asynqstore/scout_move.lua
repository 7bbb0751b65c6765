-- The scout's move (taskrl's scout): pending tasks go to the head of
-- asynq's pending list, the end its workers take from, the first named
-- taken first. A task no longer pending (a worker took it, or it was
-- deleted) stays where it is; nothing else changes.
--
-- KEYS[1]  asynq's pending list of the queue
-- ARGV     the IDs to move
--
-- Reply: how many moved.
local moved = 0
for i = #ARGV, 1, -1 do
  if redis.call('LREM', KEYS[1], 1, ARGV[i]) == 1 then
    redis.call('RPUSH', KEYS[1], ARGV[i])
    moved = moved + 1
  end
end
return moved
