-- Operators' pauses of rules (pause.go): sets or removes one pause, then
-- tidies the hash, in one call so that concurrent commands cannot undo
-- each other. Composed after internal/script/lua/gcra.lua (for gcra_now).
--
-- KEYS[1]  hash: field = rule NUL key, value = JSON {until (ms, 0: until
--          resumed), reason, by, at (ms)}
-- ARGV[1]  the field
-- ARGV[2]  "set" or "del"
-- ARGV[3]  set: the pause's length in ms (0: until resumed)
-- ARGV[4]  set: reason
-- ARGV[5]  set: who
--
-- Reply: 1 if a field was set or removed, else 0. Then pauses that have
-- ended are removed, and the hash expires a minute after the last pause
-- with an end ends, or never while one holds until resumed.
local now = math.floor(gcra_now('-1') / 1000)
local done = 0
if ARGV[2] == 'set' then
  local len = tonumber(ARGV[3])
  local untl = 0
  if len > 0 then untl = now + len end
  redis.call('HSET', KEYS[1], ARGV[1], cjson.encode({['until'] = untl, reason = ARGV[4], by = ARGV[5], at = now}))
  done = 1
else
  done = redis.call('HDEL', KEYS[1], ARGV[1])
end
local all = redis.call('HGETALL', KEYS[1])
local last, forever = now, false
for i = 1, #all, 2 do
  local ok, v = pcall(cjson.decode, all[i + 1])
  local u = ok and type(v) == 'table' and tonumber(v['until'])
  if not u then
    redis.call('HDEL', KEYS[1], all[i])
  elseif u == 0 then
    forever = true
  elseif u <= now then
    redis.call('HDEL', KEYS[1], all[i])
  elseif u > last then
    last = u
  end
end
if forever then
  redis.call('PERSIST', KEYS[1])
elseif redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('PEXPIREAT', KEYS[1], last + 60000)
end
return done
