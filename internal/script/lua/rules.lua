-- Rule kinds other than GCRA, shared by the scripts that decide rule sets.
-- A library, not a script: it defines functions and touches only the keys
-- passed to them. Times are integer microseconds below 2^53.
--
-- Every kind offers:
--   *_earliest(..., t, n) -> the earliest time >= t at which a cost-n request
--       conforms given the stored state, or -1 if it never can (n > limit);
--       a calendar window beyond the known ticks is taken to be empty;
--   *_status(..., now) -> used, remaining, reset_after;
--   *_charge(..., t, n, now, floor) -> records a cost-n request made at t.

local function fmt(x) return string.format('%d', x) end

-- Fixed and calendar windows: a hash of window start -> count, so that
-- reservations can charge future windows without losing the current one.

local function win_count(key, start)
  return tonumber(redis.call('HGET', key, fmt(start))) or 0
end

-- win_at(kind, p, t) returns the window [start, end) containing t: for a fixed
-- window p = {every}; for a calendar window p = {ticks...}; -2 when t is
-- outside the ticks.
local function win_at(kind, p, t)
  if kind == 2 then
    local start = t - (t % p[1])
    return start, start + p[1]
  end
  for i = 1, #p - 1 do
    if p[i] <= t and t < p[i + 1] then return p[i], p[i + 1] end
  end
  return -2, -2
end

local function win_earliest(key, kind, p, limit, t, n)
  if n > limit then return -1 end
  for _ = 1, 64 do
    local start, stop = win_at(kind, p, t)
    if start < 0 or win_count(key, start) + n <= limit then return t end
    t = stop
  end
  return t
end

local function win_status(key, kind, p, limit, now)
  local start, stop = win_at(kind, p, now)
  if start < 0 then return 0, limit, 0 end
  local used = win_count(key, start)
  return used, math.max(0, limit - used), stop - now
end

local function win_charge(key, kind, p, t, n, now, floor)
  local start, stop = win_at(kind, p, t)
  redis.call('HINCRBY', key, fmt(start), n)
  -- Forget windows that have ended; the key lives until its last window ends.
  local fields = redis.call('HKEYS', key)
  local last = stop
  local cur = win_at(kind, p, now)
  for _, f in ipairs(fields) do
    local s = tonumber(f)
    if cur >= 0 and s < cur then
      redis.call('HDEL', key, f)
    elseif s > start then
      local _, e = win_at(kind, p, s)
      if e > last then last = e end
    end
  end
  local ttl = math.ceil((last - now) / 1000)
  if ttl < floor then ttl = floor end
  redis.call('PEXPIRE', key, ttl)
end

local function win_refund(key, kind, p, t, n)
  local start = win_at(kind, p, t)
  if start < 0 then return end
  local c = win_count(key, start)
  if c <= n then
    redis.call('HDEL', key, fmt(start))
  else
    redis.call('HINCRBY', key, fmt(start), -n)
  end
end

-- Sliding window, exact log: a sorted set of one member per admitted unit,
-- scored by its time. A request at t conforms iff the entries newer than
-- t - every, plus n, fit in the limit (entries booked in the future count
-- too, which is conservative and never over-admits).

local function sl_trim(key, every, now)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now - every))
end

local function sl_earliest(key, limit, every, t, n)
  if n > limit then return -1 end
  local newer = redis.call('ZCOUNT', key, '(' .. fmt(t - every), '+inf')
  if newer + n <= limit then return t end
  -- Wait until all but limit-n of the newer entries have left the window.
  local older = redis.call('ZCARD', key) - newer
  local idx = older + newer - (limit - n) - 1
  local e = redis.call('ZRANGE', key, idx, idx, 'WITHSCORES')
  return math.max(t, tonumber(e[2]) + every)
end

local function sl_status(key, limit, every, now)
  local used = redis.call('ZCOUNT', key, '(' .. fmt(now - every), fmt(now))
  local reset = 0
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if first[2] then reset = math.max(0, tonumber(first[2]) + every - now) end
  return used, math.max(0, limit - used), reset
end

local function sl_charge(key, every, t, n, now, floor, nonce)
  local args = {}
  for i = 1, n do
    args[#args + 1] = fmt(t)
    args[#args + 1] = nonce .. i
  end
  redis.call('ZADD', key, unpack(args))
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  local ttl = math.ceil((tonumber(last[2]) + every - now) / 1000)
  if ttl < floor then ttl = floor end
  redis.call('PEXPIRE', key, ttl)
end

local function sl_refund(key, n, nonce)
  local members = {}
  for i = 1, n do members[i] = nonce .. i end
  redis.call('ZREM', key, unpack(members))
end

-- Concurrency: a sorted set of holders scored by lease expiry, and a hash of
-- holder -> fencing token (field "~seq" holds the last token issued). Expired leases are
-- reclaimed on every look. A holder that acquires again replaces its own
-- lease with a new token, so a redelivered task never holds two slots.

local function cc_reclaim(zkey, hkey, now)
  local gone = redis.call('ZRANGEBYSCORE', zkey, '-inf', fmt(now))
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', zkey, '-inf', fmt(now))
    redis.call('HDEL', hkey, unpack(gone))
  end
end

local function cc_earliest(zkey, cap, holder, now)
  if cap < 1 then return -1 end
  if redis.call('ZSCORE', zkey, holder) then return now end
  if redis.call('ZCARD', zkey) < cap then return now end
  local first = redis.call('ZRANGE', zkey, 0, 0, 'WITHSCORES')
  return tonumber(first[2])
end

local function cc_status(zkey, max, now)
  local used = redis.call('ZCARD', zkey)
  local reset = 0
  local first = redis.call('ZRANGE', zkey, 0, 0, 'WITHSCORES')
  if first[2] then reset = tonumber(first[2]) - now end
  return used, math.max(0, max - used), reset
end

-- cc_expire sets both keys to live until the latest lease ends. With no
-- lease left the tokens hash still lives a second, so that the token
-- sequence survives while tokens issued within one microsecond could still
-- run ahead of the clock.
local function cc_expire(zkey, hkey, now, floor)
  local last = redis.call('ZRANGE', zkey, -1, -1, 'WITHSCORES')
  local ttl = 1000
  if last[2] then
    ttl = math.ceil((tonumber(last[2]) - now) / 1000)
  end
  if ttl < floor then ttl = floor end
  if last[2] then redis.call('PEXPIRE', zkey, ttl) end
  redis.call('PEXPIRE', hkey, ttl)
end

local function cc_acquire(zkey, hkey, holder, lease, now, floor)
  redis.call('ZADD', zkey, fmt(now + lease), holder)
  -- Tokens only grow, even across the keys' expiry: at least the time.
  local token = math.max((tonumber(redis.call('HGET', hkey, '~seq')) or 0) + 1, now)
  redis.call('HSET', hkey, '~seq', fmt(token), holder, fmt(token))
  cc_expire(zkey, hkey, now, floor)
  return token
end

-- cc_release drops holder's lease if token is still its token; it returns 1
-- if it did.
local function cc_release(zkey, hkey, holder, token, now, floor)
  if tonumber(redis.call('HGET', hkey, holder)) ~= token then return 0 end
  redis.call('ZREM', zkey, holder)
  redis.call('HDEL', hkey, holder)
  cc_expire(zkey, hkey, now, floor)
  return 1
end

-- cc_renew extends holder's lease to now + lease if token is still its
-- token and the lease has not expired; it returns 1 if it did.
local function cc_renew(zkey, hkey, holder, token, lease, now, floor)
  if tonumber(redis.call('HGET', hkey, holder)) ~= token then return 0 end
  local exp = redis.call('ZSCORE', zkey, holder)
  if not exp or tonumber(exp) <= now then return 0 end
  redis.call('ZADD', zkey, fmt(now + lease), holder)
  cc_expire(zkey, hkey, now, floor)
  return 1
end
