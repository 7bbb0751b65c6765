-- GCRA rules of rule sets, with bookings anywhere ahead and fair sharing. A
-- library, not a script: it defines functions and touches only the keys of
-- the rule tables passed to it. Composed after internal/script/lua/gcra.lua,
-- whose locals and gcra_decide it uses. Times are integer microseconds below 2^53.
--
-- The model. Every admitted or booked request of cost n occupies an
-- interval [x, x + n*em) of virtual time; the intervals of one key never
-- overlap. A request made at real time a may take any free interval with
-- a <= x and x + n*em <= a + burst*em. Then in any span of real time of
-- length d the requests made in it occupy disjoint intervals inside a span
-- of d + burst*em, so at most burst + d/em of them pass: the GCRA limit,
-- whatever order the requests were booked in. When every request takes the
-- first free interval at the end of the others this is gcra_decide's
-- arithmetic exactly (the end is the TAT); the difference is that a request
-- booked far ahead, because another rule held it back until then, takes an
-- interval there and leaves the virtual time before it free for others,
-- instead of moving the TAT there.
--
-- State of a rule r (its keys r.key, r.bkey and, fair, r.fkey and r.rkey:
-- one tag):
--   r.key   string: the TAT, the end of the virtual time occupied without
--           a gap from now; "tat:last" while bookings exist, last being the
--           latest booking end ever added (it sets the keys' TTL);
--           "tat:last:block" while a block holds (fair rules);
--   r.bkey  sorted set of bookings: score = end x + n*em, member =
--           x ":" tag ":" t ":" g ":" owner: t is the real time the request
--           was booked for, owner its nonce; tag and g: see Fair;
--   r.fkey  sorted set flow -> virtual finish; r.rkey hash flow -> tags
--           returned to it (see Fair).
-- A booking is dropped when the next booking is added, 10 s after it ended
-- (so that its owner can still learn whether it held it, gc_held); once its
-- end has passed it is only skipped.
--
-- Placement. The free gaps at or after max(TAT, now) are tried in order;
-- for real time a and gap [g1, g2) the interval starts at x = g1 when
-- a <= g1, otherwise at a rounded up to a multiple of em (when burst > n
-- leaves room for it: bookings then leave gaps of whole intervals, none
-- too short to use), and it must end by g2. A request placed in the first
-- gap less than em after its start extends the TAT, which then also covers
-- the sliver before it: nothing else fits there. Any other placement is a
-- booking of its own.
--
-- Fair rules (r.fair) share their capacity among the values of a request
-- argument, its flow (a business id), so that every flow with work waiting
-- gets an equal share and a flow alone gets it all. Every request of a fair
-- rule is a booking of its own, so it can be refunded exactly and taken
-- over; the TAT only says how far from now the time is occupied without a
-- gap (by bookings, slivers and blocks), and a refund lowers it again, not
-- below a block. Each flow v has a virtual finish F_v (the sorted set
-- r.fkey, flow -> F_v, and for a flow of weight w > 1 its w - 1 copies
-- "flow#2" .. "flow#w" at the same finish). A request of flow v and weight
-- w is tagged S = max(F_v, now) and, when charged, moves F_v to
-- S + floor(n*em*W/w), W being the number of entries whose finish is ahead
-- of now, v's w included: the sum of the waiting flows' weights, of which
-- each gets its weight's share, whatever was booked before (all weights 1:
-- one interval in N). A flow's weight is the one its last request brought;
-- copies of a larger earlier weight count until their finish passes. A
-- reserve may take over (gc_takeable) another request's booking of a fair
-- rule when that booking's tag is later than its own by more than that
-- round, floor(n*em*W/w), its moment t is at least freeze ahead (its
-- owner cannot have started: the owner checks before it runs, gc_held,
-- finds the booking gone and decides again) and both requests have the
-- same global rules (g, a digest of the rules whose key is global, and
-- the fair rule): the taker runs at t in the owner's place, inheriting the
-- owner's charges on those rules (gc_inherit), and is charged its own
-- rules (the keyed ones) at t; the owner gives back only its own. The
-- lost booking's tag goes back to the owner's flow (the end of the owner's
-- nonce, requestNonce in wire.go): r.rkey, a hash flow -> the tags
-- returned to it, in order (gc_return). The flow's next charge (its owner
-- deciding again, or any request of the flow before it) is tagged with the
-- earliest of them and leaves the flow's finish where it is, as that
-- already counts the tag: a flow whose bookings are taken over keeps its
-- place and its rounds exactly (without a return, a light flow loses its
-- rounds and starves: weights 3, 2, 1 measured 53, 5 and 3 calls in 5 s
-- against shares of 30, 20 and 10; with its finish moved back to the lost
-- tag instead, the flow's next charges set the finish from there, ahead
-- of the backlog it still has, and weight 2 got up to 1.25x its share in
-- 5 s). Critical requests are tagged 0 and move no finish: they take over
-- any booking but a critical one, and theirs are never taken.
--
-- Priorities (a fair rule with r.aging > 0). A request of level p (1
-- first to 5, 3 by default; its flow ends with "!" p when p is not 3) is
-- tagged lead = (3 - p) * aging earlier than its flow's finish says: S =
-- max(F, now) - lead, and moves the finish to S + lead + its round, so
-- finishes are kept without the lead. Each level of a flow is a flow of
-- its own (its own finish, counted in W like any), so a flow's backlog of
-- a low level never delays its requests of a higher one. Take-overs
-- compare the tags as above: a level is a head start of aging per level
-- in the fair queue, which a flow that asks for more than its share uses
-- up (its finish runs ahead of now), so a lower level is held back, never
-- starved. Two differences from a plain fair rule: a booking taken over
-- gives its flow back one round off its finish (at the weights waiting
-- now), not its tag (gc_return is not used, nor measured, with
-- priorities; moving the finish back to the lost tag, as plain rules once
-- did, tagged the flow's later requests as if it had no backlog, so that
-- they, reaching the front, could no longer be taken over by a higher
-- level); and a request never takes over a booking of its own flow and
-- level (gc_takeable).
--
-- A batch (Limiter prefetch: an allow whose units its process hands out up
-- to ahead = HORIZON later) is placed at x >= a + ahead, and must still end
-- by a + burst*em: each of its units, handed out at some h in [a, a +
-- ahead], then has h <= x and x + n*em <= h + burst*em, the invariant
-- above with h for a, so units handed out late never pass the limit, and
-- every other request decides with the whole burst.
--
-- TATs and the latest booking ends are read at most once per script call
-- and written back by gc_flush at its end; bookings and finishes are
-- written at once.

local min = math.min
local tats, lasts, blocks, tat_now, tat_floor, tat_changed

-- gc_reset empties the caches above; a script call starts with it (run as
-- a Redis function, the library's locals outlive a call).
local function gc_reset()
  tats, lasts, blocks, tat_now, tat_floor, tat_changed = {}, {}, {}, {}, {}, {}
end

-- freeze is how far ahead a booking must start to be taken over: its owner
-- checks it at most a few milliseconds before its moment. keep is how long
-- a booking is kept after it ended, so that a refund soon after can still
-- tell a booking taken over (its shared charges are the taker's now) from
-- one that was not.
local freeze, keep = 250000, 10000000

-- tat_get returns the TAT stored at key, or nil, and caches it, the latest
-- booking end (lasts[key], 0 if none) and the block (blocks[key], 0).
local function tat_get(key)
  local v = tats[key]
  if v == nil then
    local s = call('GET', key)
    v, lasts[key], blocks[key] = false, 0, 0
    if s then
      v = tonumber(s)
      if not v then
        local f = {}
        for p in string.gmatch(s, '[^:]+') do f[#f + 1] = tonumber(p) end
        v, lasts[key], blocks[key] = f[1], f[2] or 0, f[3] or 0
      end
    end
    tats[key] = v
  end
  return v or nil
end

-- tat_set records a new TAT for key, written by gc_flush, with the now and
-- TTL floor its TTL is computed from. A TAT that has passed, with no
-- booking ahead, is none: the key is deleted.
local function tat_set(key, tat, now, ttl_floor)
  if tat_now[key] == nil then tat_changed[#tat_changed + 1] = key end
  if tat <= now and lasts[key] <= now then tat = false end
  tats[key], tat_now[key], tat_floor[key] = tat, now, ttl_floor
end

-- gc_flush writes the changed TATs back: each key lives until its TAT or
-- its latest booking end, whichever is later, and is deleted when both
-- have passed.
local function gc_flush()
  for _, key in ipairs(tat_changed) do
    local tat, last, now = tats[key], lasts[key], tat_now[key]
    local till = max(tat or 0, last)
    if till > now then
      local v = fmt(tat)
      if blocks[key] > now then
        v = v .. ':' .. fmt(last) .. ':' .. fmt(blocks[key])
      elseif last > now then
        v = v .. ':' .. fmt(last)
      end
      call('SET', key, v, 'PX', fmt(ttl_ms(till - now, tat_floor[key])))
    else
      call('DEL', key)
    end
  end
end

-- gc_lead is how much earlier than its flow's finish a request of flow
-- (its level after '!', 3 without) is tagged at r (see Priorities).
local function gc_lead(r, flow)
  if r.aging == 0 then return 0 end
  return (3 - (tonumber(string.match(flow, '!(%d)$')) or 3)) * r.aging
end

-- gc_load reads the rule's TAT and, for a fair rule, the request's tag
-- (r.tag) and the waiting flows' weights (r.nact: W, see Fair).
local function gc_load(r, now, critical)
  r.stored = tat_get(r.key)
  if not r.fair then return end
  r.rest = false
  if critical then
    r.tag, r.nact, r.weight, r.lead = 0, 1, 1, 0
    return
  end
  local f = tonumber(call('ZSCORE', r.fkey, r.flow)) or 0
  local n = call('ZCOUNT', r.fkey, '(' .. fmt(now), '+inf')
  if f <= now then f, n = now, n + r.weight end
  r.lead = gc_lead(r, r.flow)
  r.tag, r.nact = f - r.lead, n
  if r.aging == 0 then
    -- The earliest tag returned to the flow, if any (gc_return).
    local back = call('HGET', r.rkey, r.flow)
    if back then
      local first, rest = string.match(back, '^(%d+) ?(.*)$')
      r.tag, r.rest = tonumber(first), rest
    end
  end
end

-- gc_return gives the tag of a booking taken over back to its flow, for
-- the flow's next charge: the tags are kept in order, at most returned_max
-- (the latest dropped), until 10 s past the booking's moment t at least.
local returned_max = 64
local function gc_return(r, flow, tag, t, now, ttl_floor)
  local tags, placed = {}, false
  for v in string.gmatch(call('HGET', r.rkey, flow) or '', '%d+') do
    if not placed and tag < tonumber(v) then
      tags[#tags + 1], placed = fmt(tag), true
    end
    tags[#tags + 1] = v
  end
  if not placed then tags[#tags + 1] = fmt(tag) end
  call('HSET', r.rkey, flow, table.concat(tags, ' ', 1, min(#tags, returned_max)))
  local ttl = ttl_ms(t - now + keep, ttl_floor)
  if call('PTTL', r.rkey) < ttl then call('PEXPIRE', r.rkey, fmt(ttl)) end
end

-- gc_round is how far a charge of n moves a fair rule's flow's finish: its
-- share of the waiting flows' weights.
local function gc_round(r, n)
  return math.floor(n * r.em * r.nact / r.weight)
end

-- booking_x reads a booking member's start; booking reads all its fields:
-- x, tag, t, g, owner.
local function booking_x(m)
  return tonumber(string.match(m, '^%d+'))
end

local function booking(m)
  local x, tag, t, g, owner = string.match(m, '^(%d+):(%-?%d+):(%d+):([^:]*):(.*)$')
  return tonumber(x), tonumber(tag), tonumber(t), g, owner
end

-- member names a booking.
local function member(x, tag, t, g, owner)
  return fmt(x) .. ':' .. fmt(tag) .. ':' .. fmt(t) .. ':' .. g .. ':' .. owner
end

-- walk calls visit(x, e, member) for r's bookings that end at or after
-- from, in order, until it returns true; it returns true then, and false
-- when the bookings ran out. After limit bookings (default 2048) it gives
-- up and returns nil. Bookings never overlap, so their ends differ: each
-- page starts after the end the last one reached.
local function walk(r, from, visit, limit)
  limit = limit or 2048
  local seen, size, lo = 0, 8, fmt(from)
  while true do
    local want = min(size, limit - seen)
    local page = call('ZRANGEBYSCORE', r.bkey, lo, '+inf', 'WITHSCORES', 'LIMIT', '0', fmt(want))
    for i = 1, #page, 2 do
      if visit(booking_x(page[i]), tonumber(page[i + 1]), page[i]) then return true end
    end
    if #page < 2 * want then return false end
    seen = seen + want
    if seen >= limit then return nil end
    lo, size = '(' .. page[#page], 64
  end
end

-- place returns where a request of cost n made at t0 or later fits in the
-- free gap [g1, g2) of r's virtual time (g2 false: no end): the earliest
-- real time a and the start x; nil if it does not fit.
local function place(r, g1, g2, t0, n)
  local em = r.em
  -- The GCRA arithmetic with the gap's start as the TAT: the earliest
  -- time it conforms.
  local allowed, _, _, _, retry = gcra_decide(g1, t0, em, r.burst, n, 0, 0)
  local a, x = t0, g1
  if allowed == 0 then a = t0 + retry end
  if a > g1 then
    x = a
    if r.burst > n then x = ceil(a / em) * em end
  end
  if g2 and x + n * em > g2 then return nil end
  return a, x
end

-- gc_gap returns the earliest real time a >= t0 at which a request of cost
-- n fits in free virtual time at or after now + ahead (a batch: see
-- above; else 0), its start x, and whether it extends the TAT; or, when
-- too many bookings lie in the way to walk in one call, only the time
-- before which nothing fits (beyond t0, as the bookings walked are
-- disjoint): the caller asks again from there.
local function gc_gap(r, t0, n, now, ahead)
  local g1 = now + ahead
  if r.stored and r.stored > g1 then g1 = r.stored end
  local from = max(t0, g1)
  if lasts[r.key] < from then
    -- No booking ahead: gcra_decide's arithmetic.
    local a, x = place(r, g1, false, t0, n)
    return a, x, x - g1 < r.em
  end
  local first, a, x, front = true, nil, nil, false
  local found = walk(r, from, function(bx, e)
    if bx > g1 then
      a, x = place(r, g1, bx, t0, n)
      if a then
        front = first and x - g1 < r.em
        return true
      end
      first = false
    end
    if e > g1 then g1 = e end
  end)
  if found then return a, x, front end
  if found == nil then return g1 end
  a, x = place(r, g1, false, t0, n)
  return a, x, first and x - g1 < r.em
end

-- gc_fit returns the earliest real time a >= t0 at which a request of cost
-- n fits (placed at or after now + ahead, gc_gap), or -1 if it never does
-- (n > burst), and keeps its placement in r when a is t0: r.at = t0, r.x,
-- r.front (it extends the TAT); r.victim is false (see gc_takeable).
-- Otherwise r.at is false: the charge places the request afresh.
local function gc_fit(r, t0, n, now, ahead)
  if n > r.burst then return -1 end
  local a, x, front = gc_gap(r, t0, n, now, ahead)
  r.at, r.victim = false, false
  if a == t0 and x then r.at, r.x, r.front = a, x, front end
  return a
end

-- gc_takeable calls visit(t, x, member, owner) for the bookings of fair
-- rule r that a reserve of cost n, tag r.tag and digest g may take over, in
-- order, moments t >= t0 (see Fair), until it returns true; it looks at 256
-- bookings at most. At a rule with priorities, a request that is not
-- critical never takes over a booking of its own flow and level (the end
-- of the owner's nonce): the requests of one flow at one level keep their
-- order, and a booking taken over costs its owner one decision again, not
-- a chain of take-overs through its flow's later bookings (the owner,
-- its flow's finish given back, would take the next one, and so on to
-- the end of a backlog that may be an hour long). Plain fair rules allow
-- it: the chain re-tags a backlog booked before the waiting flows
-- changed, which brings the shares nearer their weights (design.md 1.5).
local function gc_takeable(r, t0, n, now, g, critical, visit)
  local need = n * r.em
  local low, over = max(t0, now + freeze), r.tag + gc_round(r, n)
  local own = ':' .. r.flow
  walk(r, low + need, function(bx, e, m)
    if e - bx ~= need then return false end
    local _, tag, t, bg, owner = booking(m)
    if t >= low and bg == g and tag > over and (critical or r.aging == 0 or string.sub(owner, -#own) ~= own) then
      return visit(t, bx, m, owner)
    end
  end, 256)
end

-- gc_charge places a request of cost n made at t (gc_fit's placement if it
-- was asked for t, else a new one; or the booking it takes over, r.victim)
-- and returns the undo values: the TAT after and before, or for a booking
-- of its own -x and its tag.
local function gc_charge(r, t, n, now, ttl_floor, nonce, critical, g)
  if r.at ~= t then gc_fit(r, t, n, now, 0) end
  local e = r.x + n * r.em
  if r.front and not r.fair then
    local before = r.stored or 0
    r.stored = e
    tat_set(r.key, e, now, ttl_floor)
    return e, before
  end
  local tag = 0
  if r.fair then tag = r.tag end
  if r.rest == '' then
    -- Charged at a tag returned to its flow (gc_load), which the flow's
    -- finish already counts: the finish stays.
    call('HDEL', r.rkey, r.flow)
  elseif r.rest then
    call('HSET', r.rkey, r.flow, r.rest)
  end
  if r.victim then
    call('ZREM', r.bkey, r.victim)
    -- The owner's flow (the end of its nonce) gets its round back.
    local _, vtag, vt, _, vowner = booking(r.victim)
    local vw, vflow = string.match(vowner, ':(%d+):([^:]*)$')
    if vflow and r.aging > 0 then
      -- With priorities: one round off its finish, as the lost booking's
      -- weight counts now, so that the flow's later requests keep their
      -- place (Priorities).
      local f = tonumber(call('ZSCORE', r.fkey, vflow))
      if f then
        local tf = fmt(f - math.floor(n * r.em * r.nact / tonumber(vw)))
        call('ZADD', r.fkey, 'XX', tf, vflow)
        for i = 2, tonumber(vw) do call('ZADD', r.fkey, 'XX', tf, vflow .. '#' .. i) end
      end
    elseif vflow then
      -- Else the lost booking's own tag, for the flow's next charge.
      gc_return(r, vflow, vtag, vt, now, ttl_floor)
    end
  end
  call('ZADD', r.bkey, fmt(e), member(r.x, tag, t, g, nonce))
  if lasts[r.key] > now then
    call('ZREMRANGEBYSCORE', r.bkey, '-inf', fmt(now - keep))
  end
  -- The set lives until its latest booking ends, and so does the TAT key
  -- (with a TAT of now if it had none).
  call('PEXPIRE', r.bkey, fmt(ttl_ms(max(e, lasts[r.key]) - now, ttl_floor)))
  if r.front then
    r.stored = e
    tat_set(r.key, e, now, ttl_floor)
  end
  if e > lasts[r.key] then
    lasts[r.key] = e
    r.stored = r.stored or now
    tat_set(r.key, r.stored, now, ttl_floor)
  end
  if r.fair and not critical and not r.rest then
    local f = r.tag + r.lead + gc_round(r, n)
    local fs = fmt(f)
    local add = {fs, r.flow}
    for i = 2, r.weight do
      add[#add + 1] = fs
      add[#add + 1] = r.flow .. '#' .. i
    end
    call('ZADD', r.fkey, unpack(add))
    call('ZREMRANGEBYSCORE', r.fkey, '-inf', fmt(now))
    local ttl = ttl_ms(f - now, ttl_floor)
    if call('PTTL', r.fkey) < ttl then call('PEXPIRE', r.fkey, fmt(ttl)) end
  end
  return -r.x, tag
end

-- gc_inherit makes the booking the owner of a booking taken over (victim)
-- had on global rule r at t the taker's (nonce), and returns the taker's
-- undo values for it: -x and its tag, or 0, 0 when the owner's charge
-- extended the TAT (a refund then gives back what the TAT arithmetic
-- allows, never more).
local function gc_inherit(r, t, victim, nonce, g)
  local till = t + r.burst * r.em
  local x, tag, m = false, 0, false
  walk(r, t + 1, function(bx, e, bm)
    if bx >= till then return true end
    local _, btag, bt, _, owner = booking(bm)
    if bt == t and owner == victim then
      x, tag, m = bx, btag, bm
      call('ZADD', r.bkey, fmt(e), member(bx, btag, t, g, nonce))
      return true
    end
  end)
  if not x then return 0, 0 end
  call('ZREM', r.bkey, m)
  return -x, tag
end

-- gc_status returns the rule's used, remaining and reset_after at now:
-- remaining is how many cost-1 requests fit now (counted over the first 64
-- bookings ahead at most, as if the time beyond them were taken), used is
-- burst minus that, reset_after the time until every interval has ended.
local function gc_status(r, now)
  local em, burst = r.em, r.burst
  local g1 = now
  if r.stored and r.stored > now then g1 = r.stored end
  local till = now + em * burst
  local last = lasts[r.key]
  local rem = 0
  if last > g1 and walk(r, g1, function(x, e)
    if x >= till then return true end
    if x > g1 then rem = rem + floor((x - g1) / em) end
    if e > g1 then g1 = e end
  end, 64) == nil then
    g1 = till
  end
  if g1 < till then rem = rem + floor((till - g1) / em) end
  return burst - rem, rem, max(g1, last, now) - now
end

-- gc_held reports whether the booking a charge made at t (undo values u1,
-- u2, the request's nonce and digest g) is still its own: false once
-- another request took it over (or it ended more than keep ago and was
-- dropped). Charges that are not bookings of their own always are.
local function gc_held(r, nonce, t, g)
  if r.u1 >= 0 then return true end
  return call('ZSCORE', r.bkey, member(-r.u1, r.u2, t, g, nonce)) ~= false
end

-- gc_back returns the TAT (now cur, nil if none) after giving back up to
-- back µs of a charge made at t that extended it, when charges were made
-- since: while any charge stacked on it is a booking still in the future
-- (the TAT is beyond now + burst), its slot is fixed and nothing can be
-- given back; once every stacked charge is in the past, the bucket could
-- have refilled for at most the time since t without it, so back less
-- that time, but never the interval of a booking the TAT has grown over.
local function gc_back(r, cur, t, back, now)
  local tat = max(cur or now, now)
  if tat <= now + r.em * r.burst then
    local low = tat - max(0, back - (now - t))
    if lasts[r.key] > low then
      walk(r, low + 1, function(x, e)
        if x >= tat then return true end
        low = max(low, e)
      end)
    end
    tat = min(tat, low)
  end
  return tat
end

-- gc_refund gives back a charge of cost n made at t with undo values u1, u2
-- (gc_charge's). A booking is removed if its owner still holds it (a fair
-- rule's TAT then comes back to its start, if beyond it). A charge that
-- extended the TAT restores the TAT before it if nothing was charged
-- since; otherwise it gives back what gc_back allows of n emissions (no
-- more than the TAT grew by: an adaptive rule's interval may have grown
-- since): never more than this charge still holds, however refunds
-- interleave.
local function gc_refund(r, t, n, now, ttl_floor, nonce, g)
  local cur = tat_get(r.key)
  if r.u1 < 0 then
    local x = -r.u1
    if call('ZREM', r.bkey, member(x, r.u2, t, g, nonce)) == 1 and r.fair and cur and x < cur then
      tat_set(r.key, max(x, blocks[r.key]), now, ttl_floor)
    end
    return
  end
  local tat = r.u2
  if cur ~= r.u1 then tat = gc_back(r, cur, t, min(n * r.em, r.u1 - max(r.u2, t)), now) end
  tat_set(r.key, tat, now, ttl_floor)
end

-- gc_settle changes a charge of cost n made at t (undo values r.u1, r.u2)
-- by d units. d < 0 charges -d more now, without a conformance check: the
-- TAT moves -d intervals on from max(TAT, now). d > 0 gives d back as
-- gc_refund gives n back: a booking of its own still held shrinks to its
-- first n - d intervals (removed at 0; a fair rule's TAT comes back to its
-- new end, if beyond it); a charge that extended the TAT moves the TAT back
-- d intervals if nothing was charged since, otherwise gives back what
-- gc_back allows of d intervals. Never more than the TAT grew by.
local function gc_settle(r, t, n, d, now, ttl_floor, nonce, g)
  local cur = tat_get(r.key)
  if d < 0 then
    tat_set(r.key, max(cur or now, now) - d * r.em, now, ttl_floor)
    return
  end
  if r.u1 < 0 then
    local x = -r.u1
    local m = member(x, r.u2, t, g, nonce)
    local e = tonumber(call('ZSCORE', r.bkey, m))
    if not e then return end
    local ne = x + floor((e - x) / n) * (n - d)
    if ne <= x then
      ne = x
      call('ZREM', r.bkey, m)
    else
      call('ZADD', r.bkey, 'XX', fmt(ne), m)
    end
    if r.fair and cur and ne < cur then
      tat_set(r.key, max(ne, blocks[r.key]), now, ttl_floor)
    end
    return
  end
  local back = max(0, min(d * r.em, r.u1 - max(r.u2, t)))
  local tat = r.u1 - back
  if cur ~= r.u1 then tat = gc_back(r, cur, t, back, now) end
  tat_set(r.key, tat, now, ttl_floor)
end

-- gc_block makes the rule admit nothing before till, then resume at its
-- rate: the TAT moves so that one unit conforms exactly then (and, for a
-- fair rule, refunds do not bring it back before that).
local function gc_block(r, till, now, ttl_floor)
  local tat = max(tat_get(r.key) or now, till + r.em * (r.burst - 1))
  if tat > now then
    if r.fair then blocks[r.key] = max(blocks[r.key], tat) end
    tat_set(r.key, tat, now, ttl_floor)
  end
end
