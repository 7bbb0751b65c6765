-- Rule kinds other than GCRA, shared by the scripts that decide rule sets.
-- A library, not a script: it defines functions and touches only the keys of
-- the rule tables passed to them. Times are integer microseconds below 2^53.
-- Composed after internal/script/lua/gcra.lua, whose locals and helpers
-- (fmt, ttl_ms) it uses. KIND.* name the constants of quotas/protocol.go,
-- replaced by their values (luaText).
--
-- A rule table r holds the rule's parameters (kind, key, limit, p, ...) and
-- caches what has been read of its key, so that a decision reads each value
-- once. Every kind offers:
--   *_load(r, now)           read (and tidy) the state a decision needs;
--   *_earliest(r, t, n, now) the earliest time >= t at which a cost-n request
--                            conforms, or -1 if it never can (n > limit);
--   *_charge(r, t, n, now, ttl_floor) record a cost-n request made at t;
--   *_status(r, now)         used, remaining, reset_after;
--   *_block(r, till, now, ttl_floor) admit nothing before till.
-- Windows also need win_flush() once at the end of the call.

-- Fixed (KIND.FIXED, p = {every}) and calendar (KIND.CALENDAR, p = ticks)
-- windows: a hash of window start -> count, so that reservations can charge
-- future windows without losing the current one.
--
-- Counts are cached for the whole script call (r.w is the key's cache):
-- the requests of one call read a field at most once between them, and
-- win_flush writes the changes back at the end of the call, with the same
-- result as if each request had written its own.

local win_cache, win_changed  -- key -> cache; caches with changes

-- win_reset empties the window caches; a script call starts with it.
local function win_reset() win_cache, win_changed = {}, {} end

-- win_at returns the window [start, stop) containing t, or -2 when a
-- calendar window's ticks do not cover t. r needs only kind and p.
local function win_at(r, t)
  if r.kind == KIND.FIXED then
    local start = t - (t % r.p[1])
    return start, start + r.p[1]
  end
  local p = r.p
  for i = 1, #p - 1 do
    if p[i] <= t and t < p[i + 1] then return p[i], p[i + 1] end
  end
  return -2, -2
end

local function win_count(r, start)
  local counts = r.w.counts
  local c = counts[start]
  if c == nil then
    c = tonumber(call('HGET', r.key, fmt(start))) or 0
    counts[start] = c
  end
  return c
end

-- win_load gives r the key's cache and the end of a block on the rule
-- (r.till, field "~blk" of the same hash: Block, win_block). The block and
-- the count of the window of now are read together, once per call.
local function win_load(r, now)
  local w = win_cache[r.key]
  if w == nil then
    -- fields: the changed window starts, in order; tidy: a window was
    -- started, so the ended ones go and the TTL is set, as of the window
    -- (kind, p, start, stop) started last at now; till: the block's end
    -- (false: not read yet).
    w = {key = r.key, counts = {}, fields = {}, changed = {}, tidy = false,
      kind = 0, p = false, start = 0, stop = 0, now = 0, floor = 0, till = false}
    win_cache[r.key] = w
  end
  r.w = w
  if not w.till then
    local start = win_at(r, now)
    if start >= 0 and w.counts[start] == nil then
      local v = call('HMGET', r.key, fmt(start), '~blk')
      w.counts[start], w.till = tonumber(v[1]) or 0, tonumber(v[2]) or 0
    else
      w.till = tonumber(call('HGET', r.key, '~blk')) or 0
    end
  end
  r.till = w.till
end

-- A window beyond a calendar rule's ticks is taken to be empty.
local function win_earliest(r, t, n)
  if n > r.limit then return -1 end
  for _ = 1, 64 do
    local start, stop = win_at(r, t)
    if start < 0 or win_count(r, start) + n <= r.limit then return t end
    t = stop
  end
  return t
end

-- win_set sets the count of the window starting at start; 0 deletes it.
local function win_set(r, start, c)
  local w = r.w
  w.counts[start] = c
  if not w.changed[start] then
    if #w.fields == 0 then win_changed[#win_changed + 1] = w end
    w.changed[start] = true
    w.fields[#w.fields + 1] = start
  end
end

local function win_charge(r, t, n, now, ttl_floor)
  local start, stop = win_at(r, t)
  local c = win_count(r, start) + n
  win_set(r, start, c)
  if c == n then
    local w = r.w
    w.tidy, w.kind, w.p, w.start, w.stop, w.now, w.floor = true, r.kind, r.p, start, stop, now, ttl_floor
  end
end

local function win_status(r, now)
  local start, stop = win_at(r, now)
  if start < 0 then return 0, r.limit, 0 end
  local used = win_count(r, start)
  return used, max(0, r.limit - used), stop - now
end

local function win_refund(r, t, n, now)
  win_load(r, now)
  local start = win_at(r, t)
  if start < 0 then return end
  win_set(r, start, max(0, win_count(r, start) - n))
end

-- win_block makes the rule admit nothing before till (field "~blk", never
-- lowered); the hash then lives at least until till.
local function win_block(r, till, now, ttl_floor)
  win_load(r, now)
  if till <= now or till <= r.w.till then return end
  r.w.till, r.till = till, till
  call('HSET', r.key, '~blk', fmt(till))
  local ttl = ttl_ms(till - now, ttl_floor)
  if call('PTTL', r.key) < ttl then call('PEXPIRE', r.key, fmt(ttl)) end
end

-- win_flush writes the call's changed counts back. When a window was
-- started it forgets the windows that had ended by then (and a block that
-- has), and lets the key live until its last window or its block ends.
local function win_flush()
  for _, w in ipairs(win_changed) do
    local set, del = {}, {}
    for _, s in ipairs(w.fields) do
      local c = w.counts[s]
      if c > 0 then
        set[#set + 1], set[#set + 2] = fmt(s), fmt(c)
      else
        del[#del + 1] = fmt(s)
      end
    end
    if #set > 0 then call('HSET', w.key, unpack(set)) end
    if #del > 0 then call('HDEL', w.key, unpack(del)) end
    if w.tidy then
      local cur = win_at(w, w.now)
      local last = w.stop
      for _, f in ipairs(call('HKEYS', w.key)) do
        local s = tonumber(f)
        if not s then
          -- "~blk"
          if w.till <= w.now then
            call('HDEL', w.key, f)
          elseif w.till > last then
            last = w.till
          end
        elseif cur >= 0 and s < cur then
          call('HDEL', w.key, f)
        elseif s > w.start then
          local _, e = win_at(w, s)
          if e > last then last = e end
        end
      end
      call('PEXPIRE', w.key, fmt(ttl_ms(last - w.now, w.floor)))
    end
  end
end

-- Sliding window (KIND.SLIDING, p = {every}), exact log: a sorted set of one
-- member per admitted unit, scored by its time. Entries at or before
-- now - every are dropped on every look. An entry at e counts in the
-- windows (x - every, x] with e <= x < e + every; a request of n units at t
-- conforms iff every window it counts in, those ending in [t, t + every),
-- keeps n units of room. Entries booked further ahead do not matter: a
-- booking takes room only in the windows around its own time.

local function sl_load(r, now)
  call('ZREMRANGEBYSCORE', r.key, '-inf', fmt(now - r.p[1]))
  r.total = call('ZCARD', r.key)
end

-- sl_earliest sweeps the count of the windows ending in [t, t + every) and,
-- if some have no room, tries again from the end of the last such stretch.
local function sl_earliest(r, t, n, now)
  if n > r.limit then return -1 end
  local every, room = r.p[1], r.limit - n
  if r.total <= room then return t end
  for _ = 1, 64 do
    local es = call('ZRANGEBYSCORE', r.key, '(' .. fmt(t - every), '(' .. fmt(t + every), 'WITHSCORES')
    if #es <= 2 * room then return t end
    local ts = {}
    for i = 2, #es, 2 do ts[#ts + 1] = tonumber(es[i]) end
    -- c counts the entries joined (index < j) and not yet left (>= k).
    local c, j, k = 0, 1, 1
    while j <= #ts and ts[j] <= t do c, j = c + 1, j + 1 end
    local full, last = c > room, false
    while k < j or j <= #ts do
      local x = false
      if k < j then x = ts[k] + every end
      if j <= #ts and (not x or ts[j] < x) then x = ts[j] end
      while k < j and ts[k] + every <= x do c, k = c - 1, k + 1 end
      while j <= #ts and ts[j] <= x do c, j = c + 1, j + 1 end
      if full and c <= room then
        full, last = false, x
      elseif c > room then
        full = true
      end
    end
    if not last then return t end
    t = last
  end
  return t
end

-- sl_charge adds n entries at t, named nonce .. from+1 to nonce .. from+n
-- (from: 0 unless a settle adds to a charge of from units).
local function sl_charge(r, t, n, now, ttl_floor, nonce, from)
  from = from or 0
  local args = {}
  for i = 1, n do
    args[#args + 1] = fmt(t)
    args[#args + 1] = nonce .. (from + i)
  end
  call('ZADD', r.key, unpack(args))
  -- The key lives until its newest entry leaves the window.
  local ttl = fmt(ttl_ms(t + r.p[1] - now, ttl_floor))
  if r.total == 0 then
    call('PEXPIRE', r.key, ttl)
  else
    call('PEXPIRE', r.key, ttl, 'GT')
  end
  r.total = r.total + n
end

-- used counts every entry still in the log, booked ones included: they are
-- what the next request is measured against.
local function sl_status(r, now)
  local reset = 0
  if r.total > 0 then
    local first = call('ZRANGE', r.key, '0', '0', 'WITHSCORES')
    reset = max(0, tonumber(first[2]) + r.p[1] - now)
  end
  return r.total, max(0, r.limit - r.total), reset
end

-- sl_inherit makes the n entries the owner of a booking taken over (victim,
-- booked.lua) had in rule r the taker's (nonce).
local function sl_inherit(r, n, victim, nonce)
  for i = 1, n do
    local at = call('ZSCORE', r.key, victim .. i)
    if at then
      -- Added before the old one goes: a set emptied for a moment would
      -- be deleted, and come back without its TTL.
      call('ZADD', r.key, at, nonce .. i)
      call('ZREM', r.key, victim .. i)
    end
  end
end

-- sl_refund removes the entries nonce .. from+1 to nonce .. to.
local function sl_refund(r, from, to, nonce)
  local members = {}
  for i = from + 1, to do members[#members + 1] = nonce .. i end
  call('ZREM', r.key, unpack(members))
end

-- sl_block makes the rule admit nothing before till: its block key (r.blk)
-- holds the end, never lowered, and lives until then.
local function sl_block(r, till, now, ttl_floor)
  if till > now and till > (tonumber(call('GET', r.blk)) or 0) then
    call('SET', r.blk, fmt(till), 'PX', fmt(ttl_ms(till - now, ttl_floor)))
  end
end

-- Concurrency (KIND.CONCURRENCY): a sorted set of holders scored by lease expiry
-- (r.key), and a hash of holder -> fencing token whose field "~seq" holds
-- the last token issued, "~exp" the time both keys live until and "~blk"
-- the end of a Block on the rule (r.hkey; the hash lives at least until
-- then); a holder id that starts with '~' arrives with one more
-- (holderField in Go), so no holder names these fields. A look reads the
-- three in one HMGET (cc_load).
-- Expired leases are reclaimed on every look. A holder that acquires again
-- replaces its own lease with a new token, so a redelivered task never
-- holds two slots.
--
-- An acquire whose lease would outlive the keys makes them live a quarter
-- lease longer than that lease, so that most acquires set no TTL; keys
-- live at most a quarter lease after the last lease ends.

local function cc_oldest(r)
  local first = call('ZRANGE', r.key, '0', '0', 'WITHSCORES')
  r.oldest = tonumber(first[2])
end

-- A fair rule (r.cfair) hands its free slots to the flows waiting for
-- them in turn. Its tokens hash also keeps, per holder, "~h:" .. holder:
-- the holder's flow, and per flow, "~f:" .. flow: the slots it holds (no
-- fixed field has a ':'). The flows waiting are a sorted set (fk[1],
-- r.wkey) ranked by cc_rank, the flow of the lowest rank served next, and
-- a hash (fk[2], r.ekey) of "e" .. flow: until when it waits (its last
-- denial plus CC_WAIT) and "w" .. flow: its weight; both live CC_WAIT
-- after the last wait began. A request that finds free slots takes one
-- unless at least as many other waiting flows rank below it; a denied
-- allow makes its flow wait. fk is {r.wkey, r.ekey} for a fair rule, else
-- false.
--
-- Priorities (a fair rule with r.aging > 0, µs per level). Each level of
-- a flow is a flow of its own (its name ends with "!" and the level when
-- not 3, as at a GCRA rule), ranked by its level first: CC_LEVEL times the
-- level, plus cc_rank. A flow waits at its level less one per aging it has
-- waited (at least level 1), since the earlier of: its last slot or the
-- start of its wait, kept in the waits hash as "s" .. flow while its wait
-- lasts, and the request's own first wait, r.before ago (a task
-- rescheduled before: its wait counts though its flow stopped waiting
-- meanwhile). It is reckoned at the flow's denials, and "l" .. flow keeps
-- the level part of its rank for cc_move. Taking a slot ends the flow's
-- wait: "l" goes back to its own level, "s" is dropped. So the free slots
-- go to the first level waiting (all of them: a flow of an earlier level
-- waiting holds every later one back, cc_ahead), and a later level that
-- has waited (p - q) agings ranks with level q: held back, never starved.
-- cc_rank stays below CC_LEVEL while a flow holds fewer than 10^7 slots
-- per weight.

-- CC_WAIT is how long a flow stays waiting after its last denial (µs);
-- CC_RETRY how long a request that fairness denies with no lease out
-- waits before it asks again (µs).
local CC_WAIT, CC_RETRY = 1000000, 100000

-- CC_LEVEL is a level's part of a waiting flow's rank (Priorities).
local CC_LEVEL = 10000000000000

-- cc_base is the level part of the rank of flow (its level after '!', 3
-- without) at rule r, 0 without priorities.
local function cc_base(r, flow)
  if r.aging == 0 then return 0 end
  return (tonumber(string.match(flow, '!(%d)$')) or 3) * CC_LEVEL
end

-- cc_rank is a flow's rank while it holds held slots at weight w: its
-- next slot's place in the weighted round, floor((held+1) * 10^6 / w).
local function cc_rank(held, w) return floor((held + 1) * 1000000 / w) end

-- cc_move changes the slots flow holds by d, and its rank while it waits.
local function cc_move(hkey, fk, flow, d)
  local held = call('HINCRBY', hkey, '~f:' .. flow, d)
  if held <= 0 then
    call('HDEL', hkey, '~f:' .. flow)
    held = 0
  end
  local v = call('HMGET', fk[2], 'w' .. flow, 'l' .. flow)
  local w = tonumber(v[1])
  if w then call('ZADD', fk[1], 'XX', fmt(cc_rank(held, w) + (tonumber(v[2]) or 0)), flow) end
end

-- cc_forget gives back the slots of holders, which no longer hold any, to
-- their flows.
local function cc_forget(hkey, fk, holders)
  local fields = {}
  for i = 1, #holders do fields[i] = '~h:' .. holders[i] end
  local flows = call('HMGET', hkey, unpack(fields))
  call('HDEL', hkey, unpack(fields))
  for i = 1, #holders do
    if flows[i] then cc_move(hkey, fk, flows[i], -1) end
  end
end

-- cc_reclaim drops the leases that have ended by now, as every look does
-- (fk: a fair rule's waiting keys, else false).
local function cc_reclaim(zkey, hkey, now, fk)
  local gone = call('ZRANGEBYSCORE', zkey, '-inf', fmt(now))
  if #gone == 0 then return end
  call('ZREMRANGEBYSCORE', zkey, '-inf', fmt(now))
  call('HDEL', hkey, unpack(gone))
  if fk then cc_forget(hkey, fk, gone) end
end

-- An adaptive concurrency rule (r.amin > 0) learns its number of slots
-- from the latency of the calls (limits.Concurrency states the rule;
-- quotas/slotlearn.go mirrors these functions operation for operation, so
-- both compute the same doubles). Its state is the string at r.lkey,
-- "l:b:q:h:s:m": the limit l in millionths of a slot, the no-load latency
-- b (µs, 0: none seen), the recent latency ratio q (millionths), h, until
-- when calls that started decrease l no further (µs), s, 1 until the first
-- decrease (slow start), and m, l before the last decrease. Absent:
-- {amin x 10^6, 0, 10^6, 0, 1, 0}. The key lives a day after its last
-- change.

-- cl_load returns the learned state at lkey and the number of slots it
-- allows, between amin and amax.
local function cl_load(lkey, amin, amax)
  local f = {amin * 1000000, 0, 1000000, 0, 1, 0}
  local v = call('GET', lkey)
  if v then
    local i = 0
    for p in string.gmatch(v, '[^:]+') do
      i = i + 1
      f[i] = tonumber(p)
    end
  end
  return f, max(amin, math.min(amax, floor(f[1] / 1000000)))
end

-- cl_sample learns from one call made under a slot of the rule whose
-- state is at lkey, answered at now after lat µs (0: no latency), over 1
-- when it reported overload; inflight slots were held then, its own
-- included.
local function cl_sample(lkey, amin, amax, lat, over, inflight, now)
  if lat <= 0 and over ~= 1 then return end
  local f = cl_load(lkey, amin, amax)
  local b, q, h, s, m = f[2], f[3], f[4], f[5], f[6]
  -- Within the bounds (they may have changed since it was stored).
  local l = max(amin * 1000000, math.min(amax * 1000000, f[1]))
  local cut = 0
  if over == 1 then
    cut = 0.7
  else
    if b == 0 then
      b = lat
    elseif lat < b then
      b = b - floor((b - lat) * 0.1)
    elseif l <= amin * 1000000 and q >= 1500000 then
      b = b + floor((lat - b) * 0.1)
    end
    q = q + floor((floor(lat * 1000000 / b) - q) * 0.2)
    if q >= 1500000 then
      cut = max(0.5, math.min(0.9, 1300000 / q))
    elseif q <= 1200000 and inflight * 2000000 >= l then
      if s == 1 then
        l = l + 1000000
      else
        -- A quarter slot per l calls, faster the further above m.
        l = l + floor(2.5e11 * max(1, floor((l - m) / 1000000) + 1) / l)
      end
      l = math.min(l, amax * 1000000)
    end
  end
  if cut > 0 and now - lat >= h then
    m = l
    l = max(amin * 1000000, math.min(l - 1000000, floor(l * cut)))
    s, h = 0, now + floor(b * q / 1000000)
  end
  call('SET', lkey, fmt(l) .. ':' .. fmt(b) .. ':' .. fmt(q) .. ':' .. fmt(h) .. ':' .. fmt(s) .. ':' .. fmt(m), 'PX', '86400000')
end

local function cc_load(r, now)
  local st
  if r.cfair then
    st = call('HMGET', r.hkey, '~blk', '~seq', '~exp', '~f:' .. r.flow)
  else
    st = call('HMGET', r.hkey, '~blk', '~seq', '~exp')
  end
  r.till, r.seq, r.live = tonumber(st[1]) or 0, tonumber(st[2]) or 0, tonumber(st[3]) or 0
  r.wants, r.next, r.behind = false, false, false
  cc_oldest(r)
  if r.oldest and r.oldest <= now then
    cc_reclaim(r.key, r.hkey, now, r.fk)
    cc_oldest(r)
    if r.cfair then st[4] = call('HGET', r.hkey, '~f:' .. r.flow) end
  end
  r.held = tonumber(st[4]) or 0
  r.since = now
  if r.aging > 0 then
    -- The level the flow waits at now (Priorities).
    local v = call('HMGET', r.ekey, 'e' .. r.flow, 's' .. r.flow)
    if (tonumber(v[1]) or 0) > now and v[2] then r.since, r.resets = tonumber(v[2]), true end
    r.since = math.min(r.since, now - r.before)
    local aged = floor((now - r.since) / r.aging) * CC_LEVEL
    r.lvl = max(CC_LEVEL, cc_base(r, r.flow) - aged)
  end
  r.count = 0
  if r.oldest then r.count = call('ZCARD', r.key) end
  if r.amin > 0 then
    local _
    _, r.max = cl_load(r.lkey, r.amin, r.amax)
  end
end

-- cc_ahead reports whether at least free flows other than the request's
-- wait ranking below rank p (false: any rank), or, with priorities, one
-- of an earlier level than the request's: the free slots are theirs
-- first. Flows whose wait has ended are forgotten on the way, at least
-- 16 a look.
local function cc_ahead(r, p, free, now)
  -- With priorities, a flow of an earlier level waiting takes every free
  -- slot first.
  if p and free > 1 and r.lvl > 0 and cc_ahead(r, r.lvl, 1, now) then return true end
  local bound = '+inf'
  if p then bound = '(' .. fmt(p) end
  while true do
    local ws = call('ZRANGEBYSCORE', r.wkey, '-inf', bound, 'LIMIT', '0', fmt(max(free + 1, 16)))
    if #ws == 0 then return false end
    local fields = {}
    for i = 1, #ws do fields[i] = 'e' .. ws[i] end
    local ends = call('HMGET', r.ekey, unpack(fields))
    local live, gone, dead = 0, {}, {}
    for i = 1, #ws do
      local e = tonumber(ends[i])
      if not e or e <= now then
        gone[#gone + 1] = ws[i]
        dead[#dead + 1], dead[#dead + 2] = 'e' .. ws[i], 'w' .. ws[i]
        dead[#dead + 1], dead[#dead + 2] = 's' .. ws[i], 'l' .. ws[i]
      elseif ws[i] ~= r.flow then
        live = live + 1
      end
    end
    if live >= free then return true end
    if #gone == 0 then return false end
    call('ZREM', r.wkey, unpack(gone))
    call('HDEL', r.ekey, unpack(dead))
  end
end

-- cc_outlive makes the rule's holders set, if any, and tokens hash live
-- at least ttl ms: leases that end meanwhile are then reclaimed by a look,
-- which gives a fair rule's flows their slots back.
local function cc_outlive(r, ttl)
  if call('PTTL', r.hkey) < ttl then call('PEXPIRE', r.hkey, fmt(ttl)) end
  local zt = call('PTTL', r.key)
  if zt > 0 and zt < ttl then call('PEXPIRE', r.key, fmt(ttl)) end
end

-- cc_wait makes the request's flow wait for CC_WAIT from now (a denied
-- allow of a fair rule); its rank stays that of the slots counted, at the
-- level it waits at (Priorities).
local function cc_wait(r, now, ttl_floor)
  local ttl = ttl_ms(CC_WAIT, ttl_floor)
  call('ZADD', r.wkey, fmt(cc_rank(r.held, r.weight) + r.lvl), r.flow)
  -- "s" and "l" also at a rule without priorities: processes that decide
  -- it with them (a rolling change of the policy) read what is so.
  call('HSET', r.ekey, 'e' .. r.flow, fmt(now + CC_WAIT), 'w' .. r.flow, fmt(r.weight),
    's' .. r.flow, fmt(r.since), 'l' .. r.flow, fmt(r.lvl))
  call('PEXPIRE', r.wkey, fmt(ttl))
  call('PEXPIRE', r.ekey, fmt(ttl))
  cc_outlive(r, ttl)
end

-- cc_earliest asks whether holder already holds a slot only when none is
-- free, or when a fair rule would not give it one: a holder that acquires
-- again replaces its own lease. A critical request is not held back by
-- fairness. A refusal marks the rule (r.wants) for cc_wait, and says,
-- with no block in force, whether another flow waiting ranks below the
-- request's (r.behind), or else whether, none free, the request's flow
-- is the next of several waiting (r.next; both replied in the em field).
local function cc_earliest(r, t, critical, holder, now)
  local cap = r.max
  if not critical then cap = r.max - r.reserved end
  if r.count < cap and (not r.cfair or critical) then return t end
  if r.count > 0 and call('ZSCORE', r.key, holder) then return t end
  local rank = cc_rank(r.held, r.weight) + r.lvl
  if r.count < cap and not cc_ahead(r, rank, cap - r.count, now) then return t end
  if r.cfair then
    r.wants = true
    if not critical and r.till <= now then
      if cc_ahead(r, rank, 1, now) then
        r.behind = true
      else
        r.next = r.count >= cap and cc_ahead(r, false, 1, now)
      end
    end
  end
  return r.oldest or t + CC_RETRY
end

-- cc_live records that both keys live until live (a lease's end, or now
-- plus a second when none is left: the token sequence then survives
-- while tokens issued within one microsecond could still run ahead of the
-- clock), the holders set only if holders is set, both until a block ends
-- (blk) if that is later (cc_outlive).
local function cc_live(zkey, hkey, live, holders, blk, now, ttl_floor)
  if holders then call('PEXPIRE', zkey, fmt(ttl_ms(max(live, blk) - now, ttl_floor))) end
  call('HSET', hkey, '~exp', fmt(live))
  call('PEXPIRE', hkey, fmt(ttl_ms(max(live, blk) - now, ttl_floor)))
end

-- cc_expire sets both keys to live until the latest lease ends (cc_live).
local function cc_expire(zkey, hkey, now, ttl_floor, blk)
  local last = call('ZRANGE', zkey, '-1', '-1', 'WITHSCORES')
  local live = now + 1000000
  if last[2] then live = tonumber(last[2]) end
  cc_live(zkey, hkey, live, last[2], blk, now, ttl_floor)
end

local function cc_acquire(r, holder, now, ttl_floor)
  local exp = now + r.lease
  local added = call('ZADD', r.key, fmt(exp), holder)
  -- Tokens only grow, even across the keys' expiry: at least the time.
  -- ~seq and ~exp were read by cc_load.
  local live = r.live
  local token = max(r.seq + 1, now)
  local tf = fmt(token)
  r.seq = token
  -- On an explicit clock (ttl_floor > 0) the TTLs are in real time, not
  -- the clock's: every acquire renews them.
  if live < exp or ttl_floor > 0 then
    live = max(live, exp + floor(r.lease / 4))
    r.live = live
    call('HSET', r.hkey, '~seq', tf, holder, tf, '~exp', fmt(live))
    local ttl = fmt(ttl_ms(max(live, r.till) - now, ttl_floor))
    call('PEXPIRE', r.key, ttl)
    call('PEXPIRE', r.hkey, ttl)
  else
    call('HSET', r.hkey, '~seq', tf, holder, tf)
    -- A holders set created by this acquire has no TTL yet.
    if r.count == 0 then call('PEXPIRE', r.key, fmt(ttl_ms(max(live, r.till) - now, ttl_floor))) end
  end
  if r.cfair then
    local old, ended = false, false
    if added == 0 then old = call('HGET', r.hkey, '~h:' .. holder) end
    if r.resets then
      -- The slot ends the flow's wait: it waits at its own level again.
      call('HSET', r.ekey, 'l' .. r.flow, fmt(cc_base(r, r.flow)))
      call('HDEL', r.ekey, 's' .. r.flow)
      ended = true
    end
    if old ~= r.flow then
      call('HSET', r.hkey, '~h:' .. holder, r.flow)
      if old then cc_move(r.hkey, r.fk, old, -1) end
      cc_move(r.hkey, r.fk, r.flow, 1)
    elseif ended then
      cc_move(r.hkey, r.fk, r.flow, 0)
    end
  end
  if added == 0 then
    -- The holder's previous lease, perhaps the oldest, was replaced.
    cc_oldest(r)
  else
    r.count = r.count + 1
    if not r.oldest or exp < r.oldest then r.oldest = exp end
  end
  return token
end

local function cc_status(r, now)
  local reset = 0
  if r.oldest then reset = r.oldest - now end
  return r.count, max(0, r.max - r.count), reset
end

-- cc_release drops holder's lease if token is still its token; it returns 1
-- if it did. A lease that has ended is reclaimed instead (with the others
-- that have), and 0 returned, as if the leases had been reclaimed first.
-- The two latest leases tell, in one read, the holder's end when it is one
-- of them (else it is asked for) and the latest end of the others, which
-- the keys then live until (cc_live), without reading it again.
local function cc_release(zkey, hkey, holder, token, now, ttl_floor, fk)
  local st = call('HMGET', hkey, holder, '~blk')
  if tonumber(st[1]) ~= token then return 0 end
  local top = call('ZRANGE', zkey, '-2', '-1', 'WITHSCORES')
  local exp, last, seen = false, false, false
  for i = #top - 1, 1, -2 do
    if top[i] == holder then
      exp, seen = tonumber(top[i + 1]), true
    elseif not last then
      last = tonumber(top[i + 1])
    end
  end
  if not seen then exp = tonumber(call('ZSCORE', zkey, holder)) end
  if exp and exp <= now then
    cc_reclaim(zkey, hkey, now, fk)
    return 0
  end
  call('ZREM', zkey, holder)
  call('HDEL', hkey, holder)
  if fk then cc_forget(hkey, fk, {holder}) end
  if last and last <= now then
    -- Every other lease has ended too: reclaimed, none is left.
    cc_reclaim(zkey, hkey, now, fk)
    last = false
  end
  cc_live(zkey, hkey, last or now + 1000000, last, tonumber(st[2]) or 0, now, ttl_floor)
  return 1
end

-- cc_renew extends holder's lease to now + lease if token is still its
-- token and the lease has not expired; it returns 1 if it did.
local function cc_renew(zkey, hkey, holder, token, lease, now, ttl_floor)
  local st = call('HMGET', hkey, holder, '~blk')
  if tonumber(st[1]) ~= token then return 0 end
  local exp = call('ZSCORE', zkey, holder)
  if not exp or tonumber(exp) <= now then return 0 end
  call('ZADD', zkey, fmt(now + lease), holder)
  cc_expire(zkey, hkey, now, ttl_floor, tonumber(st[2]) or 0)
  return 1
end

-- cc_block makes the rule admit nothing before till (field "~blk", never
-- lowered); the tokens hash then lives at least until till.
local function cc_block(r, till, now, ttl_floor)
  local cur = tonumber(call('HGET', r.hkey, '~blk')) or 0
  if till <= now or till <= cur then return end
  call('HSET', r.hkey, '~blk', fmt(till))
  cc_outlive(r, ttl_ms(till - now, ttl_floor))
end
