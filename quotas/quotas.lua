-- Decides groups of rules atomically: for each request, all its rules
-- admit and all are charged, or none is. One call may carry several
-- independent requests, decided one after the other (each atomically), so
-- that concurrent callers share a round trip. GCRA TATs and window state
-- are read at most once per call and written back at its end. Composed
-- after internal/script/lua/gcra.lua, booked.lua, rules.lua and learn.lua.
--
-- KEYS     per request, its rules' keys in rule order: for GCRA the TAT and
--          the bookings sorted set (see booked.lua; and for a fair one the
--          flows' finishes, for an adaptive one its learned state, see
--          learn.lua); for a fixed or calendar window its hash of
--          counts, which keeps a Block's end too (field "~blk",
--          win_block); for concurrency the holders sorted set and tokens
--          hash (which keeps a Block's end in "~blk", cc_block); for a
--          sliding window its sorted set, then its block key (a string:
--          until when a Block holds it, µs)
-- ARGV[1]  number of requests; then per request, from its first argument:
--   +1     op: 0 allow, 1 reserve, 2 refund, 3 status, 4 block, 5 held,
--          6 earliest: the moment a reserve would book, nothing charged
--          (the Cluster path agrees on one moment across slots with it),
--          7 reserve at: a reserve that books only at the time given in +9
--          (or now, if that is past); a later moment is not booked and is
--          replied as status 0 with t that moment (the Cluster path books
--          the agreed moment with it),
--          8 allow after: an allow at the previous request's now, made
--          only if the previous request (of this call) was admitted or
--          booked at its now; else nothing is read or charged and the
--          reply is status -3 (Limiter.ReserveAndAllow: a task's slots
--          decided in the call that books its turn),
--          9 settle: a charge (undo values as for a refund) becomes its
--          actual cost per rule: less gives the difference back as a
--          refund would, more charges it now without a conformance check
--          (gc_settle, win_refund/win_charge, sl_refund/sl_charge)
--   +2     explicit now in microseconds, or -1 for the server's TIME (read
--          for each request: each is decided at its own time)
--   +3     TTL floor in milliseconds (0 in production)
--   +4     cost: n, the same for every rule, or one per rule in rule order
--          joined by commas ("3,1,2"), when they differ (concurrency rules
--          ignore theirs); refund, held, settle: what the charge charged
--   +5     reserve horizon, microseconds; refund, held, settle: when the charge
--          was decided (0: unknown)
--   +6     holder id (concurrency)
--   +7     1 if the request may use a concurrency rule's critical reserve
--   +8     nonce naming this request's GCRA bookings and sliding-window
--          entries
--   +9     refund, held, settle: the time the charge was made at (reply field t);
--          reserve: book no earlier than this time (0: now);
--          block: until when the rules admit nothing
--   +10    number of rules, then per rule its kind and its parameters, or
--          0: the previous request's rules and parameters, unchanged;
--            1 GCRA         em, burst, fair (1 shared fairly by flows)
--            2 fixed        limit, every
--            3 calendar     limit, k, tick_1 .. tick_k
--            4 sliding      limit, every
--            5 concurrency  max, reserved, lease
--            6 adaptive     min, max, start, per, burst (a GCRA rule
--                           whose em is learned: learn.lua)
--          and, for a refund, held or settle only, per rule the two undo values
--          u1, u2 the charge replied; then, per fair GCRA rule, the
--          request's flow, and, if there is one, the digest g of the
--          request's global rules and a string of one '1' per rule the
--          request is charged on its own (keyed, not fair), else '0'
--          (booked.lua); for a settle only, last, the actual cost per rule
--          joined by commas
--
-- Reply: per request {status, wait, rule, now, t, then per rule: used,
--   remaining, reset_after, u1, u2, em}; held replies only the first five
--   status  1 admitted / booked / refunded / held, 0 denied, not booked or
--           not held (rule: the fair rule whose booking was taken over),
--           -2 a calendar rule has no tick range around now (retry with ticks
--           around the returned now); a refund's ticks surround t instead
--   wait    denied: the longest rule wait (-1 never); reserve: t - now
--   rule    1-based index of the rule that set wait, 0 if none
--   t       the time the charge is made at (now, the booked time, or the
--           moment of a booking taken over); for a reserve at that found
--           a later moment, that moment
--   u1, u2  what a refund needs to undo this charge exactly: a GCRA rule's
--           TAT after and before the charge (0: none), or for a booking of
--           its own -x and its tag (booked.lua); a concurrency rule's
--           fencing token; else 0
--   em      a GCRA rule's emission interval in this decision (learned, for
--           an adaptive rule); else 0
--
-- A reserve of a set with a fair rule may take over another request's
-- booking of the set's first fair rule instead of booking free time, when
-- that comes sooner (booked.lua, Fair): it then runs at that booking's
-- moment, inherits its owner's charges on the rules the two share (the
-- global ones) and is charged its own. A refund of a booking taken over
-- gives back only the owner's own rules.

local last_rules

local function flush()
  gc_flush()
  win_flush()
end

-- load reads each rule's state once; later steps use and update the cache.
local function load(r, now, critical)
  local kind = r.kind
  if kind == 4 then r.till = tonumber(call('GET', r.blk)) or 0 end
  if kind == 1 then
    gc_load(r, now, critical)
  elseif kind == 2 or kind == 3 then
    win_load(r, now)
  elseif kind == 4 then
    sl_load(r, now)
  else
    cc_load(r, now)
  end
end

-- earliest time >= t at which rule r admits a request of cost n made at
-- now; -1 never. A GCRA rule keeps where it would place the request
-- (gc_fit), which the charge then takes. Other kinds admit nothing before
-- the end of a block (r.till).
local function earliest(r, t, n, now, critical, holder)
  local kind = r.kind
  if kind == 1 then
    return gc_fit(r, t, n, now)
  end
  if t < r.till then t = r.till end
  if kind == 2 or kind == 3 then
    return win_earliest(r, t, n)
  elseif kind == 4 then
    return sl_earliest(r, t, n, now)
  end
  return max(t, cc_earliest(r, t, critical, holder))
end

-- status returns rule r's used, remaining and reset_after at now.
local function status(r, now)
  local kind = r.kind
  if kind == 1 then
    return gc_status(r, now)
  elseif kind == 2 or kind == 3 then
    return win_status(r, now)
  elseif kind == 4 then
    return sl_status(r, now)
  end
  return cc_status(r, now)
end

-- reply is a request's reply: st, wait, rule, now, t, then per rule its
-- status, the undo values (0 without undo) and a GCRA rule's interval.
local function reply(rules, nrules, now, st, wait, rule, t, undo)
  local out, j = {st, wait, rule, now, t}, 5
  for i = 1, nrules do
    local used, rem, reset = status(rules[i], now)
    local u1, u2 = 0, 0
    if undo then u1, u2 = undo[2 * i - 1], undo[2 * i] end
    local em = 0
    if rules[i].kind == 1 then em = rules[i].em end
    out[j + 1], out[j + 2], out[j + 3], out[j + 4], out[j + 5], out[j + 6] = used, rem, reset, u1, u2, em
    j = j + 6
  end
  return out
end

-- take_keys gives rule r its keys from KEYS[k] on and returns the index
-- after them.
local function take_keys(r, k)
  r.key = KEYS[k]
  k = k + 1
  if r.kind == 1 then
    r.bkey = KEYS[k]
    k = k + 1
    if r.fair then
      r.fkey = KEYS[k]
      k = k + 1
    end
    if r.adapt then
      r.lkey = KEYS[k]
      k = k + 1
    end
  else
    if r.kind == 5 then
      r.hkey = KEYS[k]
      k = k + 1
    end
    -- A fixed or calendar window keeps its block in its own hash
    -- (win_block), a concurrency rule in its tokens hash (cc_block).
    if r.kind == 4 then
      r.blk = KEYS[k]
      k = k + 1
    end
  end
  return k
end

-- take_over looks, for a reserve of a set whose first fair rule is
-- rules[fair], for the earliest booking of that rule it may take over
-- (gc_takeable) at whose moment, before limit, the request's own rules
-- admit it; it returns that moment, with the booking in the fair rule's
-- table (victim, vowner: its member and owner), or false.
local function take_over(rules, nrules, fair, t0, now, limit, critical, holder, g)
  local rf, took = rules[fair], false
  gc_takeable(rf, t0, rf.n, now, g, function(t, x, m, owner)
    if t >= limit then return true end
    for i = 1, nrules do
      local r = rules[i]
      if r.own and r.kind ~= 5 and (earliest(r, t, r.n, now, critical, holder) ~= t or r.kind == 3 and win_at(r, t) < 0) then
        return false
      end
    end
    took = t
    rf.at, rf.x, rf.front, rf.victim, rf.vowner = t, x, false, m, owner
    return true
  end)
  return took
end

-- decide decides the request whose arguments follow ARGV[a0] and whose keys
-- start at KEYS[k0]. It returns the request's reply and the k0 and a0 of
-- the next request.
local function decide(k0, a0, prev)
  local op = tonumber(ARGV[a0 + 1])
  local dry, exact = op == 6, op == 7
  if dry or exact then op = 1 end
  local skip, now = false, 0
  if op == 8 then
    op = 0
    skip = not prev or prev[1] ~= 1 or prev[5] ~= prev[4]
    if prev then now = prev[4] end
  else
    now = gcra_now(ARGV[a0 + 2])
  end
  local ttl_floor = tonumber(ARGV[a0 + 3])
  local costs = ARGV[a0 + 4]
  local n = tonumber(costs)
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
    for i = 1, nrules do k = take_keys(rules[i], k) end
  else
    -- Every field a rule table gets is in its constructor: a field added
    -- later makes Lua grow and rehash the table.
    rules = {}
    for i = 1, nrules do
      local r = {kind = tonumber(ARGV[a]), n = 0, key = false, em = 0, burst = 0, limit = 0, p = false,
        max = 0, reserved = 0, lease = 0, hkey = false, bkey = false, fkey = false, fair = false,
        flow = false, own = false, tag = 0, nact = 0, victim = false, vowner = false, u1 = 0, u2 = 0,
        stored = false, at = false, x = 0, front = false, w = false, total = 0, count = 0, oldest = false,
        blk = false, till = 0, seq = 0, live = 0, adapt = false, lkey = false, lmin = 0, lmax = 0, lstart = 0, lper = 0,
        lr = 0, lg = 0, ls = 0, ln = 0, ld = 0, lw = 0, la = 0, lk = 0, lh = 0, lc = 0, lm = 0}
      local kind = r.kind
      if kind == 1 then
        r.em, r.burst, r.fair = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), ARGV[a + 3] == '1'
        a = a + 4
      elseif kind == 6 then
        r.kind, r.adapt = 1, true
        r.lmin, r.lmax, r.lstart = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
        r.lper, r.burst = tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5])
        a = a + 6
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
        a = a + 4
      end
      k = take_keys(r, k)
      rules[i] = r
    end
    last_rules = rules
  end
  -- Each rule's cost: the same for all, or one per rule.
  if n then
    for i = 1, nrules do rules[i].n = n end
  else
    local i = 0
    for v in string.gmatch(costs, '[^,]+') do
      i = i + 1
      rules[i].n = tonumber(v)
    end
  end
  -- An adaptive rule's interval is its learned rate's, for every op.
  for i = 1, nrules do
    if rules[i].adapt and not skip then ad_load(rules[i], now, not dry and (op == 0 or op == 1 or op == 4)) end
  end
  if op == 2 or op == 5 or op == 9 then
    for i = 1, nrules do
      rules[i].u1, rules[i].u2 = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
      a = a + 2
    end
  end
  local fair, g = 0, '-'
  for i = 1, nrules do
    local r = rules[i]
    if r.fair then
      r.flow = ARGV[a]
      a = a + 1
      if fair == 0 then fair = i end
    end
  end
  if fair > 0 then
    g = ARGV[a]
    local own = ARGV[a + 1]
    for i = 1, nrules do rules[i].own = string.byte(own, i) == 49 end
    a = a + 2
  end
  local acts = false
  if op == 9 then
    acts = {}
    for v in string.gmatch(ARGV[a], '[^,]+') do acts[#acts + 1] = tonumber(v) end
    a = a + 1
  end
  if skip then
    return {-3, 0, 0, now, now}, k, a - 1
  end

  if op == 5 then
    -- Bookings are taken over by way of the set's first fair rule.
    local t = tonumber(ARGV[a0 + 9])
    if fair > 0 and not gc_held(rules[fair], nonce, t, g) then
      return {0, 0, fair, now, now}, k, a - 1
    end
    -- A booking decided before an adaptive rule's cut, for after it, was
    -- made at a rate the remote side refused.
    for i = 1, nrules do
      local r = rules[i]
      if r.adapt and r.ld > horizon and horizon > 0 and t > r.ld then
        return {0, 0, i, now, now}, k, a - 1
      end
    end
    return {1, 0, 0, now, now}, k, a - 1
  end

  if op ~= 2 and op ~= 9 then
    for i = 1, nrules do
      local r = rules[i]
      if r.kind == 3 and win_at(r, now) < 0 then
        return {-2, 0, 0, now, now}, k, a - 1
      end
    end
  end

  if op == 2 then
    -- A booking another request took over gives back only its own rules:
    -- the taker inherited the rest.
    local t = tonumber(ARGV[a0 + 9])
    local taken = fair > 0 and not gc_held(rules[fair], nonce, t, g)
    for i = 1, nrules do
      local r = rules[i]
      local kind = r.kind
      if taken and not r.own then
      elseif r.adapt and horizon > 0 and r.ld > horizon then
        -- Decided before a cut, which reset the rule's time: nothing to
        -- give back.
      elseif kind == 1 then
        gc_refund(r, t, r.n, now, ttl_floor, nonce, g)
      elseif kind == 2 or kind == 3 then
        win_refund(r, t, r.n, now)
      elseif kind == 4 then
        sl_refund(r, 0, r.n, nonce)
      elseif r.u1 > 0 then
        cc_release(r.key, r.hkey, holder, r.u1, now, ttl_floor)
      end
    end
    for i = 1, nrules do load(rules[i], now, critical) end
    return reply(rules, nrules, now, 1, 0, 0, t), k, a - 1
  end

  if op == 9 then
    -- Settle: each rule's charge becomes its actual cost. Less gives the
    -- difference back as a refund would (never more than the charge still
    -- holds); more charges the difference now, without a conformance
    -- check: the units were spent, later requests wait for them.
    local t = tonumber(ARGV[a0 + 9])
    local taken = fair > 0 and not gc_held(rules[fair], nonce, t, g)
    for i = 1, nrules do
      local r = rules[i]
      local kind, d = r.kind, r.n - acts[i]
      if d == 0 or kind == 5 or taken and not r.own then
      elseif d > 0 and r.adapt and horizon > 0 and r.ld > horizon then
        -- Decided before a cut, which reset the rule's time.
      elseif kind == 1 then
        gc_settle(r, t, r.n, d, now, ttl_floor, nonce, g)
      elseif kind == 2 or kind == 3 then
        if d > 0 then
          win_refund(r, t, d, now)
        else
          win_load(r, now)
          local at = now
          if win_at(r, now) < 0 then at = t end
          win_charge(r, at, -d, now, ttl_floor)
        end
      elseif d > 0 then
        sl_refund(r, r.n - d, r.n, nonce)
      else
        sl_load(r, now)
        sl_charge(r, now, -d, now, ttl_floor, nonce, r.n)
      end
    end
    for i = 1, nrules do load(rules[i], now, critical) end
    return reply(rules, nrules, now, 1, 0, 0, t), k, a - 1
  end

  if op == 4 then
    -- Block: the rules admit nothing before `till`. GCRA rules then resume
    -- at their rate (the TAT is moved so that one unit conforms exactly
    -- then); the others keep the end in their block key, never lowered.
    local till = tonumber(ARGV[a0 + 9])
    for i = 1, nrules do
      local r = rules[i]
      if r.kind == 1 then
        if r.adapt and ad_cut(r, now, till) then
          ad_reset(r, till, now, ttl_floor)
        else
          gc_block(r, till, now, ttl_floor)
        end
      elseif r.kind == 2 or r.kind == 3 then
        win_block(r, till, now, ttl_floor)
      elseif r.kind == 5 then
        cc_block(r, till, now, ttl_floor)
      elseif till > now and till > (tonumber(call('GET', r.blk)) or 0) then
        call('SET', r.blk, fmt(till), 'PX', fmt(ttl_ms(till - now, ttl_floor)))
      end
    end
    for i = 1, nrules do load(rules[i], now, critical) end
    return reply(rules, nrules, now, 1, 0, 0, now), k, a - 1
  end

  for i = 1, nrules do load(rules[i], now, critical) end

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
        local e = earliest(r, t, r.n, now, critical, holder)
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
  -- A reserve books t unless denied: then deny holds the wait and rule.
  local deny = false
  if op == 1 then
    local known = true
    for i = 1, nrules do
      local r = rules[i]
      if r.kind == 3 and win_at(r, t) < 0 then known = false end
    end
    local from = max(now, tonumber(ARGV[a0 + 9]))
    if not agreed or not known or t - now > horizon then
      deny = {t - now, worst}
    else
      -- Nothing is booked beyond the reset of a window longer than the
      -- horizon that is full until then: the request would keep its slot
      -- after the reset even if refunds freed the window before it. The
      -- caller tries again at the reset.
      for i = 1, nrules do
        local r = rules[i]
        if r.kind == 2 or r.kind == 3 then
          local start, stop = win_at(r, from)
          if t >= stop and stop - start > horizon and win_earliest(r, from, r.n) >= stop then
            deny = {t - now, i}
            break
          end
        end
      end
    end
    if fair > 0 then
      local limit = now + horizon + 1
      if not deny then limit = t end
      local took = take_over(rules, nrules, fair, from, now, limit, critical, holder, g)
      if took then t, deny = took, false end
    end
    if exact and t > from then
      -- Another request took the moment: charge nothing, say which is next.
      return reply(rules, nrules, now, 0, t - now, worst, t), k, a - 1
    end
    if dry and not deny then
      -- The moment alone (a booking it would take over included).
      return reply(rules, nrules, now, 1, t - now, 0, t), k, a - 1
    end
    if deny then
      return reply(rules, nrules, now, 0, deny[1], deny[2], now), k, a - 1
    end
  end

  -- Charge every rule at t; undo holds per rule u1, u2. Taking over a
  -- booking, the rules the request shares with its owner are inherited.
  local undo, victim = {}, false
  if fair > 0 and rules[fair].victim then victim = rules[fair].vowner end
  for i = 1, nrules do
    local r = rules[i]
    local kind = r.kind
    local u1, u2 = 0, 0
    if victim and not r.own and i ~= fair then
      if kind == 1 then
        u1, u2 = gc_inherit(r, t, victim, nonce, g)
      elseif kind == 4 then
        sl_inherit(r, r.n, victim, nonce)
      end
    elseif kind == 1 then
      u1, u2 = gc_charge(r, t, r.n, now, ttl_floor, nonce, critical, g)
      if r.adapt then ad_grow(r, now) end
    elseif kind == 2 or kind == 3 then
      win_charge(r, t, r.n, now, ttl_floor)
    elseif kind == 4 then
      sl_charge(r, t, r.n, now, ttl_floor, nonce)
    elseif op == 0 then
      u1 = cc_acquire(r, holder, now, ttl_floor)
    end
    undo[2 * i - 1], undo[2 * i] = u1, u2
  end
  return reply(rules, nrules, now, 1, t - now, 0, t, undo), k, a - 1
end

-- run_call decides the call's requests in order. Everything above only
-- defines; run as a Redis function (internal/script.Program) the
-- definitions run once and each call runs this alone.
local function run_call()
  gc_reset()
  win_reset()
  last_rules = {}
  local out, k, a = {}, 1, 1
  for i = 1, tonumber(ARGV[1]) do
    out[i], k, a = decide(k, a, out[i - 1])
  end
  flush()
  return out
end

return run_call()
