-- Adaptive rules: a GCRA rule whose rate is learned (quotas/adaptive.go
-- states the algorithm and mirrors these functions in Go, operation for
-- operation, so that both compute the same doubles). A library, not a
-- script: composed after gcra.lua; it touches only the learn key of the
-- rule tables passed to it.
--
-- State of an adaptive rule r: the string at r.lkey, "r:c:d:w": the rate
-- r and the rate c at the last cut (0: none), in billionths of a unit per
-- second, the time d of the last cut (µs, 0: none) and the time w it was
-- written at. Absent, or a day after w (also on an explicit clock), it is
-- r.lstart, 0, 0; the key lives a day. r.em is the emission interval of
-- the rate, in µs.
--
-- Rule parameters (from the arguments): r.lmin, r.lmax, r.lstart (rates,
-- as r) and r.lper (the rule's Per, µs).

local min = math.min

local learn_cut, learn_cut_deep, learn_again, learn_cool = 0.9, 0.6, 4, 1000000
local learn_near, learn_fast, learn_probe, learn_hold, learn_climb = 0.95, 0.1, 0.003, 20, 0.3
local learn_ttl = 86400000000

-- ad_em is the emission interval, in µs, of rate r.
local function ad_em(r)
  return max(1, ceil(1e15 / r))
end

-- ad_load reads rule r's learned state at now and sets its interval.
local function ad_load(r, now)
  local s = call('GET', r.lkey)
  r.lr, r.lc, r.ld = r.lstart, 0, 0
  if s then
    local f = {}
    for p in string.gmatch(s, '[^:]+') do f[#f + 1] = tonumber(p) end
    if now - f[4] < learn_ttl then r.lr, r.lc, r.ld = f[1], f[2], f[3] end
  end
  r.em = ad_em(r.lr)
end

local function ad_store(r, now)
  call('SET', r.lkey, fmt(r.lr) .. ':' .. fmt(r.lc) .. ':' .. fmt(r.ld) .. ':' .. fmt(now), 'PX', learn_ttl / 1000)
end

-- ad_grow raises the rate for n units admitted at now, each standing for
-- the interval r.em of traffic.
local function ad_grow(r, n, now)
  local per = r.lper
  local span = (n * r.em) / per
  local rate, c = r.lr, r.lc
  if c == 0 or now - r.ld >= learn_hold * per then
    rate = rate + rate * (learn_climb * span)
  elseif rate < learn_near * c then
    rate = min(learn_near * c, rate + c * (learn_fast * span))
  else
    rate = rate + c * (learn_probe * span)
  end
  rate = min(r.lmax, max(r.lmin, floor(rate)))
  if rate ~= r.lr then
    r.lr = rate
    ad_store(r, now)
  end
end

-- ad_cut lowers the rate for a block at now, unless a cut less than
-- learn_cool ago already answered the same congestion, and sets r.em.
local function ad_cut(r, now)
  if r.ld > 0 and now - r.ld < learn_cool then return end
  local f = learn_cut
  if r.ld > 0 and now - r.ld < learn_again * r.lper then f = learn_cut_deep end
  r.lc, r.ld = r.lr, now
  r.lr = max(r.lmin, floor(r.lr * f))
  r.em = ad_em(r.lr)
  ad_store(r, now)
end
