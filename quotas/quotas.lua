-- Decides a group of rules atomically: all admit and all are charged, or
-- none is. Composed after internal/script/lua/gcra.lua and rules.lua.
--
-- KEYS     the rules' keys in rule order: one per rule, two for concurrency
--          (holders sorted set, tokens hash)
-- ARGV[1]  op: 0 allow, 1 reserve, 2 refund, 3 status, 4 block
-- ARGV[2]  explicit now in microseconds, or -1 for the server's TIME
-- ARGV[3]  TTL floor in milliseconds (0 in production)
-- ARGV[4]  cost n
-- ARGV[5]  reserve horizon, microseconds
-- ARGV[6]  holder id (concurrency)
-- ARGV[7]  1 if the request may use a concurrency rule's critical reserve
-- ARGV[8]  nonce naming this request's sliding-window entries
-- ARGV[9]  refund: the time the charge was made at (reply field t);
--          reserve: book no earlier than this time (0: now);
--          block: until when GCRA rules admit nothing
-- ARGV[10] number of rules, then per rule its kind, its parameters and
--          the two undo values u1, u2 the charge replied (refund; else 0):
--            1 GCRA         em, burst, u1, u2
--            2 fixed        limit, every, u1, u2
--            3 calendar     limit, k, tick_1 .. tick_k, u1, u2
--            4 sliding      limit, every, u1, u2
--            5 concurrency  max, reserved, lease, u1, u2
--
-- Reply: {status, wait, rule, now, t, then per rule: used, remaining,
--   reset_after, u1, u2}
--   status  1 admitted / booked / refunded, 0 denied or not booked,
--           -2 a calendar rule has no tick range around now (retry with ticks
--           around the returned now); a refund's ticks surround t instead
--   wait    denied: the longest rule wait (-1 never); reserve: t - now
--   rule    1-based index of the rule that set wait, 0 if none
--   t       the time the charge is made at (now, or the booked time)
--   u1, u2  what a refund needs to undo this charge exactly: a GCRA rule's
--           TAT after and before the charge (0: none); a concurrency rule's
--           fencing token; else 0
local op = tonumber(ARGV[1])
local now = gcra_now(ARGV[2])
local floor = tonumber(ARGV[3])
local n = tonumber(ARGV[4])
local horizon = tonumber(ARGV[5])
local holder = ARGV[6]
local critical = ARGV[7] == '1'
local nonce = ARGV[8]

local rules = {}
local a, k = 11, 1
for i = 1, tonumber(ARGV[10]) do
  local r = {kind = tonumber(ARGV[a]), key = KEYS[k]}
  k = k + 1
  if r.kind == 1 then
    r.em, r.burst = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
    a = a + 3
  elseif r.kind == 2 or r.kind == 4 then
    r.limit, r.p = tonumber(ARGV[a + 1]), {tonumber(ARGV[a + 2])}
    a = a + 3
  elseif r.kind == 3 then
    r.limit, r.p = tonumber(ARGV[a + 1]), {}
    local cnt = tonumber(ARGV[a + 2])
    for j = 1, cnt do r.p[j] = tonumber(ARGV[a + 2 + j]) end
    a = a + 3 + cnt
  else
    r.max, r.reserved, r.lease = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
    r.hkey = KEYS[k]
    k = k + 1
    a = a + 4
  end
  r.u1, r.u2 = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  a = a + 2
  rules[i] = r
end

-- load reads each rule's state once; later steps use and update the cache.
local function load(r)
  if r.kind == 1 then
    r.stored = tonumber(redis.call('GET', r.key))
  elseif r.kind == 2 or r.kind == 3 then
    win_load(r)
  elseif r.kind == 4 then
    sl_load(r, now)
  else
    cc_load(r, now, holder)
  end
end

-- earliest time >= t at which rule r admits the request; -1 never
local function earliest(r, t)
  if r.kind == 1 then
    local allowed, _, _, _, retry = gcra_decide(r.stored, t, r.em, r.burst, n, 0, 0)
    if allowed == 1 then return t end
    if retry < 0 then return -1 end
    return t + retry
  elseif r.kind == 2 or r.kind == 3 then
    return win_earliest(r, t, n)
  elseif r.kind == 4 then
    return sl_earliest(r, t, n, now)
  end
  return cc_earliest(r, t, critical)
end

local function status(r)
  if r.kind == 1 then
    local _, _, _, rem, _, reset = gcra_decide(r.stored, now, r.em, r.burst, 0, 0, 0)
    return r.burst - rem, rem, reset
  elseif r.kind == 2 or r.kind == 3 then
    return win_status(r, now)
  elseif r.kind == 4 then
    return sl_status(r, now)
  end
  return cc_status(r, now)
end

local function reply(st, wait, rule, t, undo)
  local out = {st, wait, rule, now, t}
  for i, r in ipairs(rules) do
    local used, rem, reset = status(r)
    local u = undo[i] or {0, 0}
    out[#out + 1] = used
    out[#out + 1] = rem
    out[#out + 1] = reset
    out[#out + 1] = u[1]
    out[#out + 1] = u[2]
  end
  return out
end

for _, r in ipairs(rules) do
  if r.kind == 3 and op ~= 2 and win_at(r, now) < 0 then
    return {-2, 0, 0, now, now}
  end
end

if op == 2 then
  local t = tonumber(ARGV[9])
  for _, r in ipairs(rules) do
    if r.kind == 1 then
      -- Untouched since the charge: restore the TAT before it. Otherwise
      -- later charges were stacked on this one. While any of them is a
      -- booking still in the future (the TAT is beyond now + burst), its
      -- slot is fixed and nothing can be given back. Once every stacked
      -- charge is in the past, the bucket could have refilled for at most
      -- the time since this charge without it, so give back n emissions
      -- less that time: never more than this charge still holds, however
      -- refunds interleave.
      local cur = tonumber(redis.call('GET', r.key))
      local tat = r.u2
      if cur ~= r.u1 then
        tat = math.max(cur or now, now)
        if tat <= now + r.em * r.burst then
          tat = tat - math.max(0, n * r.em - (now - t))
        end
      end
      if tat > now then
        gcra_store(r.key, tat, 1, now, floor)
      else
        redis.call('DEL', r.key)
      end
    elseif r.kind == 2 or r.kind == 3 then
      win_refund(r, t, n)
    elseif r.kind == 4 then
      sl_refund(r, n, nonce)
    elseif r.u1 > 0 then
      cc_release(r.key, r.hkey, holder, r.u1, now, floor)
    end
  end
  for _, r in ipairs(rules) do load(r) end
  return reply(1, 0, 0, t, {})
end

if op == 4 then
  -- Block: GCRA rules admit nothing before `till`, then resume at their
  -- rate (the TAT is moved so that one unit conforms exactly then).
  local till = tonumber(ARGV[9])
  for _, r in ipairs(rules) do
    if r.kind == 1 then
      local cur = tonumber(redis.call('GET', r.key)) or now
      local tat = math.max(cur, till + r.em * (r.burst - 1))
      if tat > now then gcra_store(r.key, tat, 1, now, floor) end
    end
  end
  for _, r in ipairs(rules) do load(r) end
  return reply(1, 0, 0, now, {})
end

for _, r in ipairs(rules) do load(r) end

if op == 3 then
  return reply(1, 0, 0, now, {})
end

-- Find the time t at which every rule admits: now for an allow; for a
-- reserve the earliest such time, by raising t to each rule's earliest
-- time until all agree. Concurrency is taken when work starts, never
-- reserved.
local t, wait, worst, agreed = now, 0, 0, false
if op == 1 then t = math.max(now, tonumber(ARGV[9])) end
for _ = 1, 16 do
  local nt = t
  for i, r in ipairs(rules) do
    if not (op == 1 and r.kind == 5) then
      local e = earliest(r, t)
      if e < 0 then
        return reply(0, -1, i, now, {})
      end
      if op == 0 then
        if e - now > wait then wait, worst = e - now, i end
      elseif e > nt then
        nt, worst = e, i
      end
    end
  end
  if op == 0 or nt == t then
    agreed = true
    break
  end
  t = nt
end
if op == 0 and worst > 0 then
  return reply(0, wait, worst, now, {})
end
if op == 1 then
  local known = true
  for _, r in ipairs(rules) do
    if r.kind == 3 and win_at(r, t) < 0 then known = false end
  end
  if not agreed or not known or t - now > horizon then
    return reply(0, t - now, worst, now, {})
  end
end

local undo = {}
for i, r in ipairs(rules) do
  if r.kind == 1 then
    local _, tat, write = gcra_decide(r.stored, t, r.em, r.burst, n, 0, 0)
    gcra_store(r.key, tat, write, now, floor)
    undo[i] = {tat, r.stored or 0}
    r.stored = tat
  elseif r.kind == 2 or r.kind == 3 then
    win_charge(r, t, n, now, floor)
  elseif r.kind == 4 then
    sl_charge(r, t, n, now, floor, nonce)
  elseif op == 0 then
    undo[i] = {cc_acquire(r, holder, now, floor), 0}
  end
end
return reply(1, t - now, 0, t, undo)
