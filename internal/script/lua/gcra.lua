-- GCRA arithmetic shared by every script that decides a GCRA rule, and the
-- helpers every such script uses. A library, not a script: it defines
-- functions; only gcra_store writes a key.
--
-- All times are integer microseconds; all values stay below 2^53 (checked in
-- Go before the call), so double arithmetic here is exact.

-- The globals every script uses, as locals: a local is a register, a
-- global is a table lookup on each use, which costs measurably in scripts
-- that run on every decision.
local call, tonumber, floor, ceil, max, format = redis.call, tonumber, math.floor, math.ceil, math.max, string.format

-- fmt formats an integer for redis.call: Redis would format a Lua number
-- with %.17g, which costs more.
local function fmt(x) return format('%d', x) end

-- ttl_ms is a TTL in milliseconds covering us microseconds, at least
-- ttl_floor.
local function ttl_ms(us, ttl_floor)
  local ttl = ceil(us / 1000)
  if ttl < ttl_floor then ttl = ttl_floor end
  return ttl
end

-- gcra_decide(stored, now, em, burst, n, op, max_wait)
--   stored    theoretical arrival time (TAT) read from the key, or nil
--   now       current time
--   em        emission interval T = period / rate
--   burst     B: requests allowed at once from idle (tolerance = B*T)
--   n         cost; 0 peeks
--   op        0 allow, 1 reserve (book up to max_wait ahead), 2 refund n
--   max_wait  reserve horizon
-- returns allowed (0/1), tat (state after the call), write (0 keep, 1 set,
--   2 delete), remaining, retry_after (-1: never), reset_after, delay
local function gcra_decide(stored, now, em, burst, n, op, max_wait)
  local tol = em * burst
  local tat = now
  if stored ~= nil and stored > now then
    tat = stored
  end
  if op == 2 then
    local new = tat - n * em
    if new <= now then
      return 1, now, 2, burst, 0, 0, 0
    end
    local rem = floor((tol - (new - now)) / em)
    if rem < 0 then rem = 0 end
    return 1, new, 1, rem, 0, new - now, 0
  end
  local left = floor((tol - (tat - now)) / em)
  if left < 0 then left = 0 end
  if n > burst then
    return 0, tat, 0, left, -1, tat - now, 0
  end
  local new = tat + n * em
  local wait = new - tol - now
  if wait <= 0 or (op == 1 and wait <= max_wait) then
    local rem = floor((tol - (new - now)) / em)
    if rem < 0 then rem = 0 end
    if wait < 0 then wait = 0 end
    local write = 1
    if n == 0 then write = 0 end
    return 1, new, write, rem, 0, new - now, wait
  end
  return 0, tat, 0, left, wait, tat - now, 0
end

-- gcra_now(arg) returns arg when it is a non-negative explicit time, else the
-- server's TIME in microseconds.
local function gcra_now(arg)
  local now = tonumber(arg)
  if now >= 0 then return now end
  local t = call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- gcra_store(key, tat, write, now, ttl_floor_ms) applies a decision: sets the
-- key with a TTL equal to the time until the bucket is full again (at least
-- ttl_floor_ms), or deletes it.
local function gcra_store(key, tat, write, now, ttl_floor_ms)
  if write == 1 then
    call('SET', key, fmt(tat), 'PX', fmt(ttl_ms(tat - now, ttl_floor_ms)))
  elseif write == 2 then
    call('DEL', key)
  end
end
