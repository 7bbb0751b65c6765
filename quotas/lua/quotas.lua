-- Decides groups of rules atomically: for each request, all its rules
-- admit and all are charged, or none is. One call may carry several
-- independent requests, decided one after the other (each atomically), so
-- that concurrent callers share a round trip. GCRA TATs and window state
-- are read at most once per call and written back at its end. Composed
-- after internal/script/lua/gcra.lua, booked.lua, rules.lua and learn.lua.
-- OP.*, ARG.*, KIND.*, ST.* and REPLY.* name the constants of
-- quotas/protocol.go, which replaces each by its value when it composes
-- the script (luaText).
--
-- KEYS     per request, its rules' keys in rule order: for GCRA the TAT and
--          the bookings sorted set (see booked.lua; and for a fair one the
--          flows' finishes and the tags returned to them, for an adaptive
--          one its learned state, see learn.lua); for a fixed or calendar window its hash of
--          counts, which keeps a Block's end too (field "~blk",
--          win_block); for concurrency the holders sorted set and tokens
--          hash (which keeps a Block's end in "~blk", cc_block), and
--          for a fair one its waiting set and waits hash (cc_wait), for
--          an adaptive one its learned state (cl_load); for a
--          sliding window its sorted set, then its block key (a string:
--          until when a Block holds it, µs)
-- ARGV[1]  number of requests; then per request, whose arguments follow
--          ARGV[a0], these, each at ARGV[a0 + ARG[name]] (ARG.OP first):
--   OP     OP.ALLOW, OP.RESERVE, OP.REFUND, OP.STATUS, OP.BLOCK, OP.HELD,
--          OP.EARLIEST: the moment a reserve would book, nothing charged
--          (the Cluster path agrees on one moment across slots with it),
--          OP.RESERVE_AT: a reserve that books only at the time given in
--          AT (or now, if that is past); a later moment is not booked and
--          is replied as ST.DENIED with t that moment (the Cluster path
--          books the agreed moment with it),
--          OP.ALLOW_AFTER: an allow at the previous request's now, made
--          only if the previous request (of this call) was admitted or
--          booked at its now; else nothing is read or charged and the
--          reply is ST.SKIPPED (Limiter.ReserveAndAllow: a task's slots
--          decided in the call that books its turn),
--          OP.SETTLE: a charge (undo values as for a refund) becomes its
--          actual cost per rule: less gives the difference back as a
--          refund would, more charges it now without a conformance check
--          (gc_settle, win_refund/win_charge, sl_refund/sl_charge)
--   NOW    explicit now in microseconds, or -1 for the server's TIME (read
--          for each request: each is decided at its own time)
--   FLOOR  TTL floor in milliseconds (0 in production)
--   COST   cost: n, the same for every rule, or one per rule in rule order
--          joined by commas ("3,1,2"), when they differ (concurrency rules
--          ignore theirs); refund, held, settle: what the charge charged
--   HORIZON reserve horizon, microseconds; refund, held, settle: when the
--          charge was decided (0: unknown); block: when the call the
--          remote side throttled was decided (0: unknown; learn.lua,
--          ad_cut); allow: how far ahead of now a
--          batch's GCRA charge is placed (booked.lua; 0 for a request)
--   HOLDER holder id (concurrency)
--   CRITICAL 1 if the request may use a concurrency rule's critical reserve
--   NONCE  nonce naming this request's GCRA bookings and sliding-window
--          entries
--   AT     refund, held, settle: the time the charge was made at (reply
--          field t); reserve: book no earlier than this time (0: now);
--          block: until when the rules admit nothing
--   RULES  number of rules, then per rule its kind and its parameters
--          (read_rule), or 0: the previous request's rules and parameters,
--          unchanged;
--            KIND.GCRA         em, burst, fair (1 shared fairly by flows;
--                              at least 1000: the same, and its requests
--                              ordered by priority, aging that many µs
--                              per level, booked.lua)
--            KIND.FIXED        limit, every
--            KIND.CALENDAR     limit, k, tick_1 .. tick_k
--            KIND.SLIDING      limit, every
--            KIND.CONCURRENCY  max, reserved, lease, fair (1 slots handed
--                              to the waiting flows in turn, rules.lua;
--                              at least 1000: the same, the flows ranked
--                              by priority, aging that many µs per level),
--                              amin (above 0: the number of slots is
--                              learned between amin and max, cl_load)
--            KIND.ADAPTIVE     min, max, start, per, burst (a GCRA rule
--                              whose em is learned: learn.lua)
--          and, for a refund, held or settle only, per rule the two undo
--          values u1, u2 the charge replied; then, per fair rule (GCRA or
--          concurrency), the request's flow (at a GCRA rule ordered by
--          priority, followed by '!' and its level when not 3) and its
--          weight (1-100), and at a concurrency rule with priorities
--          how long the request has waited already (µs), and, if
--          there is a fair GCRA rule,
--          the digest g of the
--          request's global rules and a string of one '1' per rule the
--          request is charged on its own (keyed, not fair), else '0'
--          (booked.lua); for a settle only, last, the actual cost per rule
--          joined by commas
--
-- Reply: per request {status, wait, rule, now, t (REPLY.HEAD fields),
--   then per rule: used, remaining, reset_after, u1, u2, em (REPLY.RULE
--   fields)}; held, ST.NO_TICKS and ST.SKIPPED replies only the head
--   status  ST.ADMITTED admitted / booked / refunded / held, ST.DENIED
--           denied, not booked or not held (rule: the fair rule whose
--           booking was taken over, or the adaptive rule cut since the
--           charge was decided), ST.NO_TICKS a calendar rule has no
--           tick range around now (retry with ticks around the returned
--           now); a refund's ticks surround t instead
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
--           an adaptive rule); an adaptive concurrency rule's number of
--           slots (learned); for a fair concurrency rule that refused, 1
--           if none is free and the request's flow is the next of several
--           waiting, 2 if another flow waiting ranks below the request's
--           (cc_earliest); else 0
--
-- A reserve of a set with a fair rule may take over another request's
-- booking of the set's first fair rule instead of booking free time, when
-- that comes sooner (booked.lua, Fair): it then runs at that booking's
-- moment, inherits its owner's charges on the rules the two share (the
-- global ones) and is charged its own. A refund of a booking taken over
-- gives back only the owner's own rules.
--
-- serve reads a request (request) and serves it with the function of its
-- op: decide (allow, reserve, status and the reserve variants), refund,
-- settle, block, or held and uncut, after learn_load; they act on a rule
-- through functions that dispatch on its kind (load, earliest, status,
-- charge, inherit, give_back, resettle, block_rule). decide, refund,
-- settle, block, held, uncut, learn_load (learnLoad), load, earliest and
-- status mirror quotas/model.go's functions of the same names; the model
-- does the other steps inline.

-- The request being served, as request reads it (the functions below read
-- it; locals, not a table, as every look-up costs): op, with OP.EARLIEST
-- and OP.RESERVE_AT read as OP.RESERVE with dry or exact set, and
-- OP.ALLOW_AFTER as OP.ALLOW with skip set unless the previous request was
-- admitted at its now; its arguments (now, ttl_floor, horizon, holder,
-- critical, nonce, at: ARG.AT; ahead: an allow's horizon, how far ahead
-- a batch's GCRA charge is placed); its rules, nrules of them (the previous
-- request's table, when it sends 0); the index of its first fair rule, 0
-- if none, and the digest g; a settle's actual costs.
local op, dry, exact, skip, now, ttl_floor, horizon, holder, critical, nonce, at, ahead
local rules, nrules, fair, g, acts

local function flush()
  gc_flush()
  win_flush()
end

-- Per rule kind.

-- load reads rule r's state once; later steps use and update the cache.
-- A sliding window reads the end of a block from its block key (r.till);
-- windows and concurrency rules read theirs with their state.
local function load(r)
  local kind = r.kind
  if kind == KIND.GCRA then
    gc_load(r, now, critical)
  elseif kind == KIND.FIXED or kind == KIND.CALENDAR then
    win_load(r, now)
  elseif kind == KIND.SLIDING then
    r.till = tonumber(call('GET', r.blk)) or 0
    sl_load(r, now)
  else
    cc_load(r, now)
  end
end

-- earliest time >= t at which rule r admits a request of cost r.n; -1
-- never. A GCRA rule keeps where it would place the request (gc_fit),
-- which the charge then takes. Other kinds admit nothing before the end of
-- a block (r.till).
local function earliest(r, t)
  local kind = r.kind
  if kind == KIND.GCRA then
    return gc_fit(r, t, r.n, now, ahead)
  end
  if t < r.till then t = r.till end
  if kind == KIND.FIXED or kind == KIND.CALENDAR then
    return win_earliest(r, t, r.n)
  elseif kind == KIND.SLIDING then
    return sl_earliest(r, t, r.n, now)
  end
  return max(t, cc_earliest(r, t, critical, holder, now))
end

-- status returns rule r's used, remaining and reset_after at now.
local function status(r)
  local kind = r.kind
  if kind == KIND.GCRA then
    return gc_status(r, now)
  elseif kind == KIND.FIXED or kind == KIND.CALENDAR then
    return win_status(r, now)
  elseif kind == KIND.SLIDING then
    return sl_status(r, now)
  end
  return cc_status(r, now)
end

-- charge charges rule r at t and returns its undo values u1, u2. A
-- concurrency rule is taken by an allow only.
local function charge(r, t)
  local kind = r.kind
  if kind == KIND.GCRA then
    local u1, u2 = gc_charge(r, t, r.n, now, ttl_floor, nonce, critical, g)
    if r.adapt then ad_grow(r, now) end
    return u1, u2
  elseif kind == KIND.FIXED or kind == KIND.CALENDAR then
    win_charge(r, t, r.n, now, ttl_floor)
  elseif kind == KIND.SLIDING then
    sl_charge(r, t, r.n, now, ttl_floor, nonce)
  elseif op == OP.ALLOW then
    return cc_acquire(r, holder, now, ttl_floor), 0
  end
  return 0, 0
end

-- inherit makes the charge on rule r of the booking's owner victim, taken
-- over at t, the request's; it returns the undo values u1, u2.
local function inherit(r, t, victim)
  local kind = r.kind
  if kind == KIND.GCRA then
    return gc_inherit(r, t, victim, nonce, g)
  elseif kind == KIND.SLIDING then
    sl_inherit(r, r.n, victim, nonce)
  end
  return 0, 0
end

-- give_back undoes the request's charge on rule r, made at at (ARG.AT).
local function give_back(r)
  local kind = r.kind
  if kind == KIND.GCRA then
    gc_refund(r, at, r.n, now, ttl_floor, nonce, g)
  elseif kind == KIND.FIXED or kind == KIND.CALENDAR then
    win_refund(r, at, r.n, now)
  elseif kind == KIND.SLIDING then
    sl_refund(r, 0, r.n, nonce)
  elseif r.u1 > 0 then
    cc_release(r.key, r.hkey, holder, r.u1, now, ttl_floor, r.fk)
  end
end

-- resettle makes the request's charge on rule r, made at at, d units less
-- (d < 0: -d more, charged now). Concurrency rules are never settled.
local function resettle(r, d)
  local kind = r.kind
  if kind == KIND.GCRA then
    gc_settle(r, at, r.n, d, now, ttl_floor, nonce, g)
  elseif kind == KIND.FIXED or kind == KIND.CALENDAR then
    if d > 0 then
      win_refund(r, at, d, now)
    else
      win_load(r, now)
      local t = now
      if win_at(r, now) < 0 then t = at end
      win_charge(r, t, -d, now, ttl_floor)
    end
  elseif d > 0 then
    sl_refund(r, r.n - d, r.n, nonce)
  else
    sl_load(r, now)
    sl_charge(r, now, -d, now, ttl_floor, nonce, r.n)
  end
end

-- block_rule makes rule r admit nothing before till. GCRA rules then
-- resume at their rate (the TAT is moved so that one unit conforms exactly
-- then; an adaptive rule the block cuts starts afresh); the others keep
-- the end in their block key, never lowered.
local function block_rule(r, till)
  local kind = r.kind
  if kind == KIND.GCRA then
    if r.adapt and ad_cut(r, now, till, horizon) then
      ad_reset(r, till, now, ttl_floor)
    else
      gc_block(r, till, now, ttl_floor)
    end
  elseif kind == KIND.FIXED or kind == KIND.CALENDAR then
    win_block(r, till, now, ttl_floor)
  elseif kind == KIND.CONCURRENCY then
    cc_block(r, till, now, ttl_floor)
  else
    sl_block(r, till, now, ttl_floor)
  end
end

-- Reading a request.

-- take_keys gives rule r its keys from KEYS[k] on and returns the index
-- after them.
local function take_keys(r, k)
  r.key = KEYS[k]
  k = k + 1
  if r.kind == KIND.GCRA then
    r.bkey = KEYS[k]
    k = k + 1
    if r.fair then
      r.fkey, r.rkey = KEYS[k], KEYS[k + 1]
      k = k + 2
    end
    if r.adapt then
      r.lkey = KEYS[k]
      k = k + 1
    end
  else
    if r.kind == KIND.CONCURRENCY then
      r.hkey = KEYS[k]
      k = k + 1
      if r.cfair then
        r.wkey, r.ekey = KEYS[k], KEYS[k + 1]
        r.fk = {r.wkey, r.ekey}
        k = k + 2
      end
      if r.amin > 0 then
        r.lkey = KEYS[k]
        k = k + 1
      end
    end
    -- A fixed or calendar window keeps its block in its own hash
    -- (win_block), a concurrency rule in its tokens hash (cc_block).
    if r.kind == KIND.SLIDING then
      r.blk = KEYS[k]
      k = k + 1
    end
  end
  return k
end

-- read_rule reads the kind and parameters of a rule from ARGV[a] on into a
-- new rule table and returns it and the index after them. An adaptive rule
-- is a GCRA rule with adapt set.
local function read_rule(a)
  -- Every field a rule table gets is in its constructor: a field added
  -- later makes Lua grow and rehash the table.
  local r = {kind = tonumber(ARGV[a]), n = 0, key = false, em = 0, burst = 0, limit = 0, p = false,
    max = 0, reserved = 0, lease = 0, hkey = false, bkey = false, fkey = false, rkey = false, rest = false, fair = false,
    flow = false, weight = 1, aging = 0, lead = 0, own = false, tag = 0, nact = 0, victim = false, vowner = false, u1 = 0, u2 = 0,
    stored = false, at = false, x = 0, front = false, w = false, total = 0, count = 0, oldest = false,
    blk = false, till = 0, seq = 0, live = 0, adapt = false, lkey = false, lmin = 0, lmax = 0, lstart = 0, lper = 0,
    lr = 0, lg = 0, ls = 0, ln = 0, ld = 0, lw = 0, la = 0, lk = 0, lh = 0, lc = 0, lm = 0,
    cfair = false, wkey = false, ekey = false, fk = false, held = 0, wants = false, next = false,
    lvl = 0, since = 0, before = 0, resets = false}
  local kind = r.kind
  if kind == KIND.GCRA then
    r.em, r.burst = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
    local f = tonumber(ARGV[a + 3])
    r.fair = f > 0
    if f > 1 then r.aging = f end
    return r, a + 4
  elseif kind == KIND.ADAPTIVE then
    r.kind, r.adapt = KIND.GCRA, true
    r.lmin, r.lmax, r.lstart = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
    r.lper, r.burst = tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5])
    return r, a + 6
  elseif kind == KIND.FIXED or kind == KIND.SLIDING then
    r.limit, r.p = tonumber(ARGV[a + 1]), {tonumber(ARGV[a + 2])}
    return r, a + 3
  elseif kind == KIND.CALENDAR then
    local cnt = tonumber(ARGV[a + 2])
    local p = {}
    for j = 1, cnt do p[j] = tonumber(ARGV[a + 2 + j]) end
    r.limit, r.p = tonumber(ARGV[a + 1]), p
    return r, a + 3 + cnt
  end
  r.max, r.reserved, r.lease = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local fair = tonumber(ARGV[a + 4])
  r.cfair, r.amin, r.amax = fair > 0, tonumber(ARGV[a + 5]), r.max
  if fair >= 1000 then r.aging = fair end
  return r, a + 6
end

-- request reads the request whose arguments follow ARGV[a0] and whose keys
-- start at KEYS[k0]; prev is the previous request's reply. It returns the
-- k0 and a0 of the next request.
local function request(k0, a0, prev)
  op = tonumber(ARGV[a0 + ARG.OP])
  dry, exact, skip = op == OP.EARLIEST, op == OP.RESERVE_AT, false
  if dry or exact then op = OP.RESERVE end
  if op == OP.ALLOW_AFTER then
    op, now = OP.ALLOW, 0
    skip = not prev or prev[1] ~= ST.ADMITTED or prev[5] ~= prev[4]
    if prev then now = prev[4] end
  else
    now = gcra_now(ARGV[a0 + ARG.NOW])
  end
  ttl_floor, horizon = tonumber(ARGV[a0 + ARG.FLOOR]), tonumber(ARGV[a0 + ARG.HORIZON])
  ahead = 0
  if op == OP.ALLOW then ahead = horizon end
  holder, critical = ARGV[a0 + ARG.HOLDER], ARGV[a0 + ARG.CRITICAL] == '1'
  nonce, at = ARGV[a0 + ARG.NONCE], tonumber(ARGV[a0 + ARG.AT])

  nrules = tonumber(ARGV[a0 + ARG.RULES])
  local a, k = a0 + ARG.RULES + 1, k0
  if nrules == 0 then
    -- The previous request's rules with this request's keys; load reads
    -- their state afresh.
    nrules = #rules
    for i = 1, nrules do k = take_keys(rules[i], k) end
  else
    rules = {}
    for i = 1, nrules do
      rules[i], a = read_rule(a)
      k = take_keys(rules[i], k)
    end
  end
  -- Each rule's cost: the same for all, or one per rule.
  local costs = ARGV[a0 + ARG.COST]
  local n = tonumber(costs)
  if n then
    for i = 1, nrules do rules[i].n = n end
  else
    local i = 0
    for v in string.gmatch(costs, '[^,]+') do
      i = i + 1
      rules[i].n = tonumber(v)
    end
  end
  if op == OP.REFUND or op == OP.HELD or op == OP.SETTLE then
    for i = 1, nrules do
      rules[i].u1, rules[i].u2 = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
      a = a + 2
    end
  end
  fair, g = 0, '-'
  for i = 1, nrules do
    local r = rules[i]
    if r.fair or r.cfair then
      r.flow, r.weight = ARGV[a], tonumber(ARGV[a + 1])
      a = a + 2
      if r.cfair and r.aging > 0 then
        r.before = tonumber(ARGV[a])
        a = a + 1
      end
      if fair == 0 and r.fair then fair = i end
    end
  end
  if fair > 0 then
    g = ARGV[a]
    local own = ARGV[a + 1]
    for i = 1, nrules do rules[i].own = string.byte(own, i) == 49 end
    a = a + 2
  end
  acts = false
  if op == OP.SETTLE then
    acts = {}
    for v in string.gmatch(ARGV[a], '[^,]+') do acts[#acts + 1] = tonumber(v) end
    a = a + 1
  end
  return k, a - 1
end

-- learn_load gives each adaptive rule the interval of its learned rate,
-- for every op; an allow, a reserve that books and a block count the busy
-- time since the last look (ad_load).
local function learn_load()
  local credit = not dry and (op == OP.ALLOW or op == OP.RESERVE or op == OP.BLOCK)
  for i = 1, nrules do
    if rules[i].adapt then ad_load(rules[i], now, credit) end
  end
end

-- ticked reports whether every calendar rule has ticks around now.
local function ticked()
  for i = 1, nrules do
    local r = rules[i]
    if r.kind == KIND.CALENDAR and win_at(r, now) < 0 then
      return false
    end
  end
  return true
end

-- Per op.

-- reply is the request's reply: st, wait, rule, now, t, then per rule its
-- status, with charged its undo values (r.u1, r.u2; else 0) and a GCRA
-- rule's interval.
local function reply(st, wait, rule, t, charged)
  -- Sized for one rule: a table that grows is rehashed.
  local out, j = {st, wait, rule, now, t, 0, 0, 0, 0, 0, 0}, REPLY.HEAD
  for i = 1, nrules do
    local r = rules[i]
    local used, rem, reset = status(r)
    local u1, u2 = 0, 0
    if charged then u1, u2 = r.u1, r.u2 end
    local em = 0
    if r.kind == KIND.GCRA then
      em = r.em
    elseif r.amin and r.amin > 0 then
      em = r.max
    elseif r.next then
      em = 1
    elseif r.behind then
      em = 2
    end
    out[j + 1], out[j + 2], out[j + 3], out[j + 4], out[j + 5], out[j + 6] = used, rem, reset, u1, u2, em
    j = j + REPLY.RULE
  end
  return out
end

-- reloaded is the reply after a refund, settle or block: every rule's
-- state read afresh.
local function reloaded(t)
  for i = 1, nrules do load(rules[i]) end
  return reply(ST.ADMITTED, 0, 0, t)
end

-- held reports whether the booking of the set's first fair rule that the
-- request's charge made is still its own: bookings are taken over by way
-- of that rule.
local function held()
  return fair == 0 or gc_held(rules[fair], nonce, at, g)
end

-- uncut reports whether no adaptive rule was cut after the request's
-- charge was decided and before the charge's time (a booking made at a
-- rate the remote side refused); if one was, it returns false and the
-- rule's index.
local function uncut()
  for i = 1, nrules do
    local r = rules[i]
    if r.adapt and r.ld > horizon and horizon > 0 and at > r.ld then
      return false, i
    end
  end
  return true
end

-- refund gives back the request's charge. A booking another request took
-- over gives back only its own rules: the taker inherited the rest; an
-- adaptive rule decided before a cut, which reset the rule's time, nothing.
local function refund()
  local taken = not held()
  for i = 1, nrules do
    local r = rules[i]
    if taken and not r.own then
    elseif r.adapt and horizon > 0 and r.ld > horizon then
    else
      give_back(r)
    end
  end
  return reloaded(at)
end

-- settle makes each rule's charge its actual cost. Less gives the
-- difference back as a refund would (never more than the charge still
-- holds); more charges the difference now, without a conformance check:
-- the units were spent, later requests wait for them.
local function settle()
  local taken = not held()
  for i = 1, nrules do
    local r = rules[i]
    local d = r.n - acts[i]
    if d == 0 or r.kind == KIND.CONCURRENCY or taken and not r.own then
    elseif d > 0 and r.adapt and horizon > 0 and r.ld > horizon then
      -- Decided before a cut, which reset the rule's time.
    else
      resettle(r, d)
    end
  end
  return reloaded(at)
end

-- block makes the rules admit nothing before at.
local function block()
  for i = 1, nrules do block_rule(rules[i], at) end
  return reloaded(now)
end

-- take_over looks, for a reserve of a set whose first fair rule is
-- rules[fair], for the earliest booking of that rule it may take over
-- (gc_takeable) at whose moment, before limit, the request's own rules
-- admit it; it returns that moment, with the booking in the fair rule's
-- table (victim, vowner: its member and owner), or false.
local function take_over(t0, limit)
  local rf, took = rules[fair], false
  gc_takeable(rf, t0, rf.n, now, g, critical, function(t, x, m, owner)
    if t >= limit then return true end
    for i = 1, nrules do
      local r = rules[i]
      if r.own and r.kind ~= KIND.CONCURRENCY and (earliest(r, t) ~= t or
          r.kind == KIND.CALENDAR and win_at(r, t) < 0) then
        return false
      end
    end
    took = t
    rf.at, rf.x, rf.front, rf.victim, rf.vowner = t, x, false, m, owner
    return true
  end)
  return took
end

-- book decides whether a reserve books t, the moment every rule admits
-- (agreed: all did; worst: the rule that set it), or a booking it takes
-- over; it returns the moment to charge, or false and the reply.
local function book(t, worst, agreed)
  -- deny, if not false, holds the wait and rule of a refusal.
  local deny, known = false, true
  for i = 1, nrules do
    local r = rules[i]
    if r.kind == KIND.CALENDAR and win_at(r, t) < 0 then known = false end
  end
  local from = max(now, at)
  if not agreed or not known or t - now > horizon then
    deny = {t - now, worst}
  else
    -- Nothing is booked beyond the reset of a window longer than the
    -- horizon that is full until then: the request would keep its slot
    -- after the reset even if refunds freed the window before it. The
    -- caller tries again at the reset.
    for i = 1, nrules do
      local r = rules[i]
      if r.kind == KIND.FIXED or r.kind == KIND.CALENDAR then
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
    local took = take_over(from, limit)
    if took then t, deny = took, false end
  end
  if exact and t > from then
    -- Another request took the moment: charge nothing, say which is next.
    return false, reply(ST.DENIED, t - now, worst, t)
  end
  if dry and not deny then
    -- The moment alone (a booking it would take over included).
    return false, reply(ST.ADMITTED, t - now, 0, t)
  end
  if deny then
    return false, reply(ST.DENIED, deny[1], deny[2], now)
  end
  return t
end

-- decide decides an allow, a reserve or a status: it finds the time t at
-- which every rule admits (now for an allow; for a reserve the earliest
-- such time, by raising t to each rule's earliest time until all agree;
-- concurrency is taken when work starts, never reserved) and charges
-- every rule at t. Taking over a booking, the rules the request shares
-- with its owner are inherited.
local function decide()
  for i = 1, nrules do load(rules[i]) end
  if op == OP.STATUS then
    return reply(ST.ADMITTED, 0, 0, now)
  end
  local t, wait, worst, agreed = now, 0, 0, false
  if op == OP.RESERVE then t = max(now, at) end
  for _ = 1, 16 do
    local nt = t
    for i = 1, nrules do
      local r = rules[i]
      if not (op == OP.RESERVE and r.kind == KIND.CONCURRENCY) then
        local e = earliest(r, t)
        if e < 0 then
          return reply(ST.DENIED, -1, i, now)
        end
        if op == OP.ALLOW then
          if e - now > wait then wait, worst = e - now, i end
        elseif e > nt then
          nt, worst = e, i
        end
      end
    end
    if op == OP.ALLOW or nt == t then
      agreed = true
      break
    end
    t = nt
  end
  if op == OP.ALLOW and worst > 0 then
    -- The flows a fair concurrency rule refused wait for its slots.
    for i = 1, nrules do
      if rules[i].wants then cc_wait(rules[i], now, ttl_floor) end
    end
    return reply(ST.DENIED, wait, worst, now)
  end
  if op == OP.RESERVE then
    local out
    t, out = book(t, worst, agreed)
    if not t then return out end
  end
  -- Each rule keeps its undo values in u1, u2.
  local victim = false
  if fair > 0 and rules[fair].victim then victim = rules[fair].vowner end
  for i = 1, nrules do
    local r = rules[i]
    if victim and not r.own and i ~= fair then
      r.u1, r.u2 = inherit(r, t, victim)
    else
      r.u1, r.u2 = charge(r, t)
    end
  end
  return reply(ST.ADMITTED, t - now, 0, t, true)
end

-- serve reads and serves the request whose arguments follow ARGV[a0] and
-- whose keys start at KEYS[k0]; it returns the request's reply and the k0
-- and a0 of the next request.
local function serve(k0, a0, prev)
  local k, a = request(k0, a0, prev)
  if skip then
    return {ST.SKIPPED, 0, 0, now, now}, k, a
  end
  learn_load()
  if op == OP.HELD then
    if not held() then
      return {ST.DENIED, 0, fair, now, now}, k, a
    end
    local ok, i = uncut()
    if not ok then
      return {ST.DENIED, 0, i, now, now}, k, a
    end
    return {ST.ADMITTED, 0, 0, now, now}, k, a
  end
  if op == OP.REFUND then
    return refund(), k, a
  elseif op == OP.SETTLE then
    return settle(), k, a
  elseif not ticked() then
    return {ST.NO_TICKS, 0, 0, now, now}, k, a
  elseif op == OP.BLOCK then
    return block(), k, a
  end
  return decide(), k, a
end

-- run_call serves the call's requests in order. Everything above only
-- defines; run as a Redis function (internal/script.Program) the
-- definitions run once and each call runs this alone.
local function run_call()
  gc_reset()
  win_reset()
  rules = {}
  local out, k, a = {}, 1, 1
  for i = 1, tonumber(ARGV[1]) do
    out[i], k, a = serve(k, a, out[i - 1])
  end
  flush()
  return out
end

return run_call()
