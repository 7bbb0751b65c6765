-- Decides groups of rules atomically: for each request, all its rules
-- admit and all are charged, or none is. One call may carry several
-- independent requests, decided one after the other (each atomically), so
-- that concurrent callers share a round trip. GCRA and window state is read
-- at most once per call and written back at its end. Composed after
-- internal/script/lua/gcra.lua and rules.lua.
--
-- KEYS     per request, its rules' keys in rule order: one per rule, two
--          for concurrency (holders sorted set, tokens hash)
-- ARGV[1]  number of requests; then per request, from its first argument:
--   +1     op: 0 allow, 1 reserve, 2 refund, 3 status, 4 block
--   +2     explicit now in microseconds, or -1 for the server's TIME (read
--          for each request: each is decided at its own time)
--   +3     TTL floor in milliseconds (0 in production)
--   +4     cost n
--   +5     reserve horizon, microseconds
--   +6     holder id (concurrency)
--   +7     1 if the request may use a concurrency rule's critical reserve
--   +8     nonce naming this request's sliding-window entries
--   +9     refund: the time the charge was made at (reply field t);
--          reserve: book no earlier than this time (0: now);
--          block: until when GCRA rules admit nothing
--   +10    number of rules, then per rule its kind and its parameters, or
--          0: the previous request's rules and parameters, unchanged;
--            1 GCRA         em, burst
--            2 fixed        limit, every
--            3 calendar     limit, k, tick_1 .. tick_k
--            4 sliding      limit, every
--            5 concurrency  max, reserved, lease
--          and, for a refund only, per rule the two undo values u1, u2 the
--          charge replied
--
-- Reply: per request {status, wait, rule, now, t, then per rule: used,
--   remaining, reset_after, u1, u2}
--   status  1 admitted / booked / refunded, 0 denied or not booked,
--           -2 a calendar rule has no tick range around now (retry with ticks
--           around the returned now); a refund's ticks surround t instead
--   wait    denied: the longest rule wait (-1 never); reserve: t - now
--   rule    1-based index of the rule that set wait, 0 if none
--   t       the time the charge is made at (now, or the booked time)
--   u1, u2  what a refund needs to undo this charge exactly: a GCRA rule's
--           TAT after and before the charge (0: none); a concurrency rule's
--           fencing token; else 0

local last_rules = {}

-- GCRA TATs are cached for the whole call, like window counts (see
-- rules.lua): read at most once, and written back by flush at the end.
local tats, tat_ttl, tat_changed = {}, {}, {}  -- key -> TAT or false (no key); TTL in ms, 0 deletes

local function tat_get(key)
  local v = tats[key]
  if v == nil then
    v = tonumber(call('GET', key)) or false
    tats[key] = v
  end
  return v or nil
end

-- tat_put stores tat, with a TTL until the bucket is full again, or deletes
-- the key when tat is not after now.
local function tat_put(key, tat, now, ttl_floor)
  if tat_ttl[key] == nil then tat_changed[#tat_changed + 1] = key end
  if tat > now then
    tats[key], tat_ttl[key] = tat, ttl_ms(tat - now, ttl_floor)
  else
    tats[key], tat_ttl[key] = false, 0
  end
end

local function flush()
  for _, key in ipairs(tat_changed) do
    local tat = tats[key]
    if tat then
      call('SET', key, fmt(tat), 'PX', fmt(tat_ttl[key]))
    else
      call('DEL', key)
    end
  end
  win_flush()
end

-- load reads each rule's state once; later steps use and update the cache.
local function load(r, now)
  local kind = r.kind
  if kind == 1 then
    r.stored = tat_get(r.key)
  elseif kind == 2 or kind == 3 then
    win_load(r)
  elseif kind == 4 then
    sl_load(r, now)
  else
    cc_load(r, now)
  end
end

-- earliest time >= t at which rule r admits a request of cost n made at
-- now; -1 never. A GCRA rule keeps the TAT admitting at t would leave
-- (r.at, r.tat), which the charge then stores.
local function earliest(r, t, n, now, critical, holder)
  local kind = r.kind
  if kind == 1 then
    local allowed, tat, _, _, retry = gcra_decide(r.stored, t, r.em, r.burst, n, 0, 0)
    if allowed == 1 then
      r.at, r.tat = t, tat
      return t
    end
    if retry < 0 then return -1 end
    return t + retry
  elseif kind == 2 or kind == 3 then
    return win_earliest(r, t, n)
  elseif kind == 4 then
    return sl_earliest(r, t, n, now)
  end
  return cc_earliest(r, t, critical, holder)
end

-- status returns rule r's used, remaining and reset_after at now.
local function status(r, now)
  local kind = r.kind
  if kind == 1 then
    -- gcra_decide's peek (n = 0), inline.
    local tat = r.stored
    if not tat or tat < now then tat = now end
    local rem = floor((r.em * r.burst - (tat - now)) / r.em)
    if rem < 0 then rem = 0 end
    return r.burst - rem, rem, tat - now
  elseif kind == 2 or kind == 3 then
    return win_status(r, now)
  elseif kind == 4 then
    return sl_status(r, now)
  end
  return cc_status(r, now)
end

-- reply is a request's reply: st, wait, rule, now, t, then per rule its
-- status and the undo values (0 without undo).
local function reply(rules, nrules, now, st, wait, rule, t, undo)
  local out, j = {st, wait, rule, now, t}, 5
  for i = 1, nrules do
    local used, rem, reset = status(rules[i], now)
    local u1, u2 = 0, 0
    if undo then u1, u2 = undo[2 * i - 1], undo[2 * i] end
    out[j + 1], out[j + 2], out[j + 3], out[j + 4], out[j + 5] = used, rem, reset, u1, u2
    j = j + 5
  end
  return out
end

-- decide decides the request whose arguments follow ARGV[a0] and whose keys
-- start at KEYS[k0]. It returns the request's reply and the k0 and a0 of
-- the next request.
local function decide(k0, a0)
  local op = tonumber(ARGV[a0 + 1])
  local now = gcra_now(ARGV[a0 + 2])
  local ttl_floor = tonumber(ARGV[a0 + 3])
  local n = tonumber(ARGV[a0 + 4])
  local horizon = tonumber(ARGV[a0 + 5])
  local holder = ARGV[a0 + 6]
  local critical = ARGV[a0 + 7] == '1'
  local nonce = ARGV[a0 + 8]

  local rules, nrules = last_rules, tonumber(ARGV[a0 + 10])
  local a, k = a0 + 11, k0
  if nrules == 0 then
    -- The previous request's rules with this request's keys; load reads
    -- their state afresh.
    nrules = #rules
    for i = 1, nrules do
      local r = rules[i]
      r.key = KEYS[k]
      k = k + 1
      if r.kind == 5 then
        r.hkey = KEYS[k]
        k = k + 1
      end
    end
  else
    -- Every field a rule table gets is in its constructor: a field added
    -- later makes Lua grow and rehash the table.
    rules = {}
    for i = 1, nrules do
      local r = {kind = tonumber(ARGV[a]), key = KEYS[k], em = 0, burst = 0, limit = 0, p = false,
        max = 0, reserved = 0, lease = 0, hkey = false, u1 = 0, u2 = 0, stored = false, at = false,
        tat = 0, w = false, total = 0, count = 0, oldest = false}
      k = k + 1
      local kind = r.kind
      if kind == 1 then
        r.em, r.burst = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
        a = a + 3
      elseif kind == 2 or kind == 4 then
        r.limit, r.p = tonumber(ARGV[a + 1]), {tonumber(ARGV[a + 2])}
        a = a + 3
      elseif kind == 3 then
        local cnt = tonumber(ARGV[a + 2])
        local p = {}
        for j = 1, cnt do p[j] = tonumber(ARGV[a + 2 + j]) end
        r.limit, r.p = tonumber(ARGV[a + 1]), p
        a = a + 3 + cnt
      else
        r.max, r.reserved, r.lease = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
        r.hkey = KEYS[k]
        k = k + 1
        a = a + 4
      end
      rules[i] = r
    end
    last_rules = rules
  end
  if op == 2 then
    for i = 1, nrules do
      rules[i].u1, rules[i].u2 = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
      a = a + 2
    end
  end

  if op ~= 2 then
    for i = 1, nrules do
      local r = rules[i]
      if r.kind == 3 and win_at(r, now) < 0 then
        return {-2, 0, 0, now, now}, k, a - 1
      end
    end
  end

  if op == 2 then
    local t = tonumber(ARGV[a0 + 9])
    for i = 1, nrules do
      local r = rules[i]
      local kind = r.kind
      if kind == 1 then
        -- Untouched since the charge: restore the TAT before it. Otherwise
        -- later charges were stacked on this one. While any of them is a
        -- booking still in the future (the TAT is beyond now + burst), its
        -- slot is fixed and nothing can be given back. Once every stacked
        -- charge is in the past, the bucket could have refilled for at most
        -- the time since this charge without it, so give back n emissions
        -- less that time: never more than this charge still holds, however
        -- refunds interleave.
        local cur = tat_get(r.key)
        local tat = r.u2
        if cur ~= r.u1 then
          tat = max(cur or now, now)
          if tat <= now + r.em * r.burst then
            tat = tat - max(0, n * r.em - (now - t))
          end
        end
        tat_put(r.key, tat, now, ttl_floor)
      elseif kind == 2 or kind == 3 then
        win_refund(r, t, n)
      elseif kind == 4 then
        sl_refund(r, n, nonce)
      elseif r.u1 > 0 then
        cc_release(r.key, r.hkey, holder, r.u1, now, ttl_floor)
      end
    end
    for i = 1, nrules do load(rules[i], now) end
    return reply(rules, nrules, now, 1, 0, 0, t), k, a - 1
  end

  if op == 4 then
    -- Block: GCRA rules admit nothing before `till`, then resume at their
    -- rate (the TAT is moved so that one unit conforms exactly then).
    local till = tonumber(ARGV[a0 + 9])
    for i = 1, nrules do
      local r = rules[i]
      if r.kind == 1 then
        local tat = max(tat_get(r.key) or now, till + r.em * (r.burst - 1))
        if tat > now then tat_put(r.key, tat, now, ttl_floor) end
      end
    end
    for i = 1, nrules do load(rules[i], now) end
    return reply(rules, nrules, now, 1, 0, 0, now), k, a - 1
  end

  for i = 1, nrules do load(rules[i], now) end

  if op == 3 then
    return reply(rules, nrules, now, 1, 0, 0, now), k, a - 1
  end

  -- Find the time t at which every rule admits: now for an allow; for a
  -- reserve the earliest such time, by raising t to each rule's earliest
  -- time until all agree. Concurrency is taken when work starts, never
  -- reserved.
  local t, wait, worst, agreed = now, 0, 0, false
  if op == 1 then t = max(now, tonumber(ARGV[a0 + 9])) end
  for _ = 1, 16 do
    local nt = t
    for i = 1, nrules do
      local r = rules[i]
      if not (op == 1 and r.kind == 5) then
        local e = earliest(r, t, n, now, critical, holder)
        if e < 0 then
          return reply(rules, nrules, now, 0, -1, i, now), k, a - 1
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
    return reply(rules, nrules, now, 0, wait, worst, now), k, a - 1
  end
  if op == 1 then
    local known = true
    for i = 1, nrules do
      local r = rules[i]
      if r.kind == 3 and win_at(r, t) < 0 then known = false end
    end
    if not agreed or not known or t - now > horizon then
      return reply(rules, nrules, now, 0, t - now, worst, now), k, a - 1
    end
    -- Nothing is booked beyond the reset of a window longer than the
    -- horizon that is full until then: the GCRA rules, charged after the
    -- reset, would hold back every request before it, even once refunds
    -- free the window. The caller tries again at the reset.
    local from = max(now, tonumber(ARGV[a0 + 9]))
    for i = 1, nrules do
      local r = rules[i]
      if r.kind == 2 or r.kind == 3 then
        local start, stop = win_at(r, from)
        if t >= stop and stop - start > horizon and win_earliest(r, from, n) >= stop then
          return reply(rules, nrules, now, 0, t - now, i, now), k, a - 1
        end
      end
    end
  end

  -- Charge every rule at t; undo holds per rule u1, u2.
  local undo = {}
  for i = 1, nrules do
    local r = rules[i]
    local kind = r.kind
    local u1, u2 = 0, 0
    if kind == 1 then
      if r.at ~= t then earliest(r, t, n, now, critical, holder) end
      tat_put(r.key, r.tat, now, ttl_floor)
      u1, u2 = r.tat, r.stored or 0
      r.stored = r.tat
    elseif kind == 2 or kind == 3 then
      win_charge(r, t, n, now, ttl_floor)
    elseif kind == 4 then
      sl_charge(r, t, n, now, ttl_floor, nonce)
    elseif op == 0 then
      u1 = cc_acquire(r, holder, now, ttl_floor)
    end
    undo[2 * i - 1], undo[2 * i] = u1, u2
  end
  return reply(rules, nrules, now, 1, t - now, 0, t, undo), k, a - 1
end

local out, k, a = {}, 1, 1
for i = 1, tonumber(ARGV[1]) do
  out[i], k, a = decide(k, a)
end
flush()
return out
