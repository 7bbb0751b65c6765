-- Renews, releases or drops concurrency leases, one after the other: one
-- call may carry several, so that the tasks of a process that end together
-- share a round trip. Composed after internal/script/lua/gcra.lua
-- (gcra_now) and rules.lua. LEASE.* and LARG.* name the constants of
-- quotas/protocol.go, replaced by their values (luaText).
--
-- KEYS     per lease, its rule's holders sorted set and tokens hash, then,
--          for a fair rule, its waiting set and waits hash (rules.lua,
--          cc_wait), for an adaptive one its learned state (cl_sample)
-- ARGV[1]  number of leases; then per lease LARG.N arguments, the lease's
--          at ARGV[a + LARG.OP] and so on (a = 2 for the first):
--   OP     LEASE.RENEW, LEASE.RELEASE or LEASE.DROP (release whatever the
--          token: the holder is a process's own whose acquiring call
--          failed, and no one else's)
--   NOW    explicit now in microseconds, or -1 for the server's TIME
--   FLOOR  TTL floor in milliseconds (0 in production)
--   HOLDER holder id
--   TOKEN  fencing token the holder got when it acquired
--   LENGTH renew: new lease length, microseconds
--   KEYS   how many keys the lease has (2; 4 for a fair rule, 3 for an
--          adaptive one)
--   AMIN, AMAX  an adaptive rule's Min and Max (0, 0: not adaptive)
--   LAT, OVER   release: the latency of the call made under the slot, µs
--          (0: none), and 1 if it reported overload, else 0: an adaptive
--          rule learns from them (cl_sample) when the release is the
--          holder's
--
-- Reply: per lease {1} if it was renewed / released / dropped, {0} if the
-- holder no longer holds it under that token (expired and reclaimed, or
-- re-acquired; a drop: it held none).

-- lease serves the lease whose arguments start at ARGV[a] and whose keys
-- start at KEYS[k].
local function lease(k, a)
  local op, now = tonumber(ARGV[a + LARG.OP]), gcra_now(ARGV[a + LARG.NOW])
  local ttl_floor, holder = tonumber(ARGV[a + LARG.FLOOR]), ARGV[a + LARG.HOLDER]
  local zkey, hkey = KEYS[k], KEYS[k + 1]
  local fk = false
  if tonumber(ARGV[a + LARG.KEYS]) == 4 then fk = {KEYS[k + 2], KEYS[k + 3]} end
  if op == LEASE.RENEW then
    -- Expired leases are reclaimed first, as on every look.
    local r = {key = zkey, hkey = hkey, oldest = false}
    cc_oldest(r)
    if r.oldest and r.oldest <= now then cc_reclaim(zkey, hkey, now, fk) end
    return cc_renew(zkey, hkey, holder, tonumber(ARGV[a + LARG.TOKEN]), tonumber(ARGV[a + LARG.LENGTH]), now, ttl_floor)
  end
  if op == LEASE.DROP then
    if call('ZREM', zkey, holder) == 0 then return 0 end
    call('HDEL', hkey, holder)
    if fk then cc_forget(hkey, fk, {holder}) end
    cc_expire(zkey, hkey, now, ttl_floor, tonumber(call('HGET', hkey, '~blk')) or 0)
    return 1
  end
  -- LEASE.RELEASE: a release reclaims what it needs to itself (cc_release).
  local lat, over = tonumber(ARGV[a + LARG.LAT]), tonumber(ARGV[a + LARG.OVER])
  local learn, inflight = tonumber(ARGV[a + LARG.AMIN]) > 0 and (lat > 0 or over == 1), 0
  if learn then inflight = call('ZCOUNT', zkey, '(' .. fmt(now), '+inf') end
  local done = cc_release(zkey, hkey, holder, tonumber(ARGV[a + LARG.TOKEN]), now, ttl_floor, fk)
  if done == 1 and learn then
    cl_sample(KEYS[k + 2], tonumber(ARGV[a + LARG.AMIN]), tonumber(ARGV[a + LARG.AMAX]), lat, over, inflight, now)
  end
  return done
end

-- run_call serves the call's leases in order. Everything above only
-- defines; run as a Redis function (internal/script.Program) the
-- definitions run once and each call runs this alone.
local function run_call()
  local out, k, a = {}, 1, 2
  for i = 1, tonumber(ARGV[1]) do
    out[i] = {lease(k, a)}
    k, a = k + tonumber(ARGV[a + LARG.KEYS]), a + LARG.N
  end
  return out
end

return run_call()
