-- Adaptive rules: a GCRA rule whose rate is learned (quotas/adaptive.go
-- states the algorithm and mirrors these functions in Go, operation for
-- operation, so that both compute the same doubles). A library, not a
-- script: composed after internal/script/lua/gcra.lua and booked.lua; it touches only the learn key of the
-- rule tables passed to it.
--
-- State of an adaptive rule r: the string at r.lkey,
-- "r:g:s:n:d:w:a:k:h:c:m:x" (quotas/adaptive.go, learned): the rate r and the
-- last good rate g while probing (0: not), in billionths of a unit per
-- second; the probe step s in millionths; when the next probe is due (n;
-- while probing, when its units start), the last cut (d), the time busy
-- time is counted from (w) and the busy time at the current rate (a), in
-- µs; k, 1 after a good probe; h, the rate that was good before the limit
-- fell (0: none); c, 1 once the current rate was good for a dwell; m, 1
-- when the next probe steps from the good rate even below h, 2 after a
-- nudge until the next probe; x, the most units above the good rate a
-- failed probe passed before its throttle, in thousandths (0 in a state
-- stored without it). Absent, or a day after w (also on an
-- explicit clock), it is the rule's start. The key lives a day. r.em is
-- the emission interval of the rate, in µs.
--
-- Rule parameters (from the arguments): r.lmin, r.lmax, r.lstart (rates,
-- as r) and r.lper (the rule's Per, µs).

local learn_dwell, learn_dwell_units, learn_dwell_more, learn_dwell_cap = 2, 4, 16, 4
local learn_hold, learn_hold_units, learn_hold_back, learn_back_units = 24, 100, 8, 60
local learn_step0, learn_step_cut, learn_step_jump, learn_step_min, learn_step_max, learn_step_fail = 0.25, 0.2, 0.1, 0.02, 1.0, 4
local learn_cut, learn_nudge, learn_nudge_again, learn_forget, learn_cool, learn_ttl = 0.7, 0.97, 0.9, 0.97, 1000000, 86400000000
local learn_excess, learn_excess_back, learn_excess_next = 5, 4, 5

-- ad_em is the emission interval, in µs, of rate r.
local function ad_em(r)
  return max(1, ceil(1e15 / r))
end

-- ad_dwell is the busy time, µs, that makes the rate of r good: the
-- longest of P/2, 4 em and 16 em up to 4 P.
local function ad_dwell(r)
  local em = ad_em(r.lr)
  return max(floor(r.lper / learn_dwell), learn_dwell_units * em, min(learn_dwell_more * em, learn_dwell_cap * r.lper))
end

local function ad_store(r)
  call('SET', r.lkey, fmt(r.lr) .. ':' .. fmt(r.lg) .. ':' .. fmt(r.ls) .. ':' .. fmt(r.ln) .. ':' .. fmt(r.ld) ..
    ':' .. fmt(r.lw) .. ':' .. fmt(r.la) .. ':' .. fmt(r.lk) .. ':' .. fmt(r.lh) .. ':' .. fmt(r.lc) .. ':' .. fmt(r.lm) .. ':' .. fmt(r.lx),
    'PX', fmt(learn_ttl / 1000))
end

-- ad_load reads rule r's learned state at now and sets its interval; with
-- credit (a decision or a block), the rule's busy time since w, up to its
-- TAT, is counted at the current rate and stored.
local function ad_load(r, now, credit)
  local s = call('GET', r.lkey)
  local f = false
  if s then
    f = {}
    for p in string.gmatch(s, '[^:]+') do f[#f + 1] = tonumber(p) end
    if now - f[6] >= learn_ttl then f = false end
  end
  if f then
    r.lr, r.lg, r.ls, r.ln, r.ld, r.lw, r.la, r.lk, r.lh, r.lc, r.lm, r.lx = f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[10], f[11], f[12] or 0
  else
    r.lr, r.lg, r.ls, r.ln, r.ld, r.lw, r.la, r.lk, r.lh, r.lc, r.lm, r.lx = r.lstart, 0, learn_step0 * 1e6, 0, 0, now, 0, 0, 0, 0, 0, 0
  end
  r.em = ad_em(r.lr)
  if credit then
    local busy = min(now, tat_get(r.key) or 0) - r.lw
    if busy > 0 then r.la = r.la + busy end
    r.lw = max(r.lw, now)
    ad_store(r)
  end
end

-- ad_hold is how long after a failure the next probe waits, µs: shorter
-- while a remembered rate is more than 10 % above the current one.
local function ad_hold(r)
  if r.lh * 10 > r.lr * 11 then return max(learn_hold_back * r.lper, learn_back_units * ad_em(r.lr)) end
  return max(learn_hold * r.lper, learn_hold_units * ad_em(r.lr))
end

-- ad_excess_wait is the busy time, µs, after which a probe that has not
-- passed learn_excess units (r.lx if more) above the good rate is good
-- all the same: learn_excess_back P while a remembered rate is more than
-- 10 % above the current one, learn_excess_next P right after a kept probe
-- (k), the hold otherwise.
local function ad_excess_wait(r)
  if r.lh * 10 > r.lr * 11 then return learn_excess_back * r.lper end
  if r.lk == 1 then return learn_excess_next * r.lper end
  return ad_hold(r)
end

-- ad_excess is the units a probe passed above the good rate, busy for r.la.
local function ad_excess(r)
  return r.la * (r.lr - r.lg) / 1e15
end

-- ad_grow, after a charge at now: a rate busy for a dwell is good (a probe
-- that was, and that passed learn_excess units more than the good rate in
-- it, or r.lx thousandths if more, or was busy for ad_excess_wait, is
-- kept, the next due at once; two in a row double the step, the first at
-- the smallest step makes it learn_step_jump); then a due probe starts,
-- straight to the remembered rate if higher once the hold has passed
-- since the last cut (unless the last probe to it failed).
local function ad_grow(r, now)
  if r.la < ad_dwell(r) then return end
  if r.lg > 0 and r.la < ad_excess_wait(r) and ad_excess(r) < max(learn_excess, r.lx / 1e3) then return end
  r.la, r.lc = 0, 1
  if r.lg > 0 then
    r.lg, r.ln = 0, now
    if r.lk == 1 then
      r.ls = min(learn_step_max * 1e6, 2 * r.ls)
    elseif r.ls <= learn_step_min * 1e6 then
      r.ls = learn_step_jump * 1e6
    end
    r.lk = 1
    if r.lr >= r.lh then r.lh = 0 end
  end
  if now >= r.ln and r.lr < r.lmax then
    -- The probe's units come after the TAT: busy time counts from there.
    r.lw = max(r.lw, tat_get(r.key) or 0)
    r.lg, r.ln, r.lc = r.lr, r.lw, 0
    local up = min(r.lmax, floor(r.lr * (1 + r.ls / 1e6)))
    if r.lm ~= 1 and now >= r.ld + ad_hold(r) then up = max(up, r.lh) end
    r.lr, r.lm = up, 0
  end
  ad_store(r)
end

-- ad_cut lowers the rate for a block at now until till of a call decided
-- at decided (0: unknown), and sets r.em: a failed probe goes back to the
-- last good rate, a good rate is cut. A call decided before the last cut
-- went out at the rate that cut answered: its throttle is the same
-- congestion, and cuts nothing; one decided at or after it is new
-- evidence. With the decision time unknown, a cut less than learn_cool
-- ago answered it. It reports whether it cut.
local function ad_cut(r, now, till, decided)
  if r.ld > 0 then
    if decided > 0 then
      if decided < r.ld then return false end
    elseif now - r.ld < learn_cool then
      return false
    end
  end
  local c = 0
  if r.lg > 0 and now < r.ln then
    -- The probe's units have not gone out yet: the throttle is the good
    -- rate's, good for a dwell.
    r.lr, r.lg, r.lc = r.lg, 0, 1
  end
  if r.lg > 0 then
    r.lx = max(r.lx, floor(ad_excess(r) * 1e3))
    if r.lh > 0 and r.lr >= r.lh then
      -- The rate that was good before the limit fell is not yet.
      r.lh = floor(r.lh * learn_forget)
      if r.lh <= r.lg then r.lh = 0 end
      r.lm = 1 -- the next probe steps from the good rate
    end
    r.lr, r.lg = r.lg, 0
    c = 1 -- the last good rate was good for a dwell
    r.ln = now + ad_hold(r)
    if r.ls > 2 * learn_step_min * 1e6 then r.ln = now + floor(r.lper / learn_dwell) end
    r.ls = max(learn_step_min * 1e6, floor(r.ls / learn_step_fail))
  elseif r.lc == 1 and (r.ld > 0 or r.lk == 1) then
    -- Good for a dwell: the limit fell, or the calls' jitter crossed it.
    -- A small cut, the rate remembered (a little lower if it was
    -- already), and small probes after the hold. Nudged already within
    -- the hold, with no probe since, the rate is above the limit, not at
    -- it (a vendor's burst made it look good): a larger cut.
    r.lh = max(r.lh, r.lr)
    if r.lr >= r.lh then r.lh = floor(r.lr * learn_forget) end
    local f = learn_nudge
    if r.lm == 2 and now < r.ln then f = learn_nudge_again end
    r.lr = max(r.lmin, floor(r.lr * f))
    r.ls, r.ln = learn_step_min * 1e6, now + ad_hold(r)
    if r.lm == 0 then r.lm = 2 end
  else
    -- A rate not yet good, or the start before any cut or kept probe
    -- (never measured: a vendor's burst can make a start far above its
    -- limit look good, and remembered it drew a 429 every other probe):
    -- cut hard, and search up from there with big steps after a dwell.
    r.lr = max(r.lmin, floor(r.lr * learn_cut))
    r.ls, r.ln = learn_step_cut * 1e6, now + floor(r.lper / learn_dwell)
  end
  r.lk, r.lc, r.ld, r.la, r.lw = 0, c, now, 0, max(r.lw, till)
  r.em = ad_em(r.lr)
  ad_store(r)
  return true
end

-- ad_reset starts the rule's time afresh after a cut: nothing conforms
-- before till, one unit exactly then, at the new rate. What was booked
-- before (at the rate refused) is forgotten: Held tells its owners, who
-- decide again, and their refunds give nothing back (quotas.lua).
local function ad_reset(r, till, now, ttl_floor)
  call('DEL', r.bkey)
  lasts[r.key] = 0
  tat_set(r.key, till + r.em * (r.burst - 1), now, ttl_floor)
end
