-- Renews, releases or drops one concurrency lease. Composed after
-- internal/script/lua/gcra.lua (gcra_now) and rules.lua. LEASE.* name the
-- constants of quotas/protocol.go, replaced by their values (luaText).
--
-- KEYS[1]  the rule's holders sorted set
-- KEYS[2]  the rule's tokens hash
-- KEYS[3]  a fair rule's waiting set and KEYS[4] its waits hash (rules.lua,
--          cc_wait); absent if the rule is not fair
-- ARGV[1]  op: LEASE.RENEW, LEASE.RELEASE or LEASE.DROP (release whatever
--          the token: the holder is a process's own whose acquiring call
--          failed, and no one else's)
-- ARGV[2]  explicit now in microseconds, or -1 for the server's TIME
-- ARGV[3]  TTL floor in milliseconds (0 in production)
-- ARGV[4]  holder id
-- ARGV[5]  fencing token the holder got when it acquired
-- ARGV[6]  renew: new lease length, microseconds
--
-- Reply: 1 if the lease was renewed / released / dropped, 0 if the holder
-- no longer holds it under that token (expired and reclaimed, or
-- re-acquired; a drop: it held none).
local op, now = tonumber(ARGV[1]), gcra_now(ARGV[2])
local ttl_floor = tonumber(ARGV[3])
local fk = false
if KEYS[3] then fk = {KEYS[3], KEYS[4]} end
if op == LEASE.RENEW then
  -- Expired leases are reclaimed first, as on every look.
  local r = {key = KEYS[1], hkey = KEYS[2], oldest = false}
  cc_oldest(r)
  if r.oldest and r.oldest <= now then cc_reclaim(KEYS[1], KEYS[2], now, fk) end
  return cc_renew(KEYS[1], KEYS[2], ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6]), now, ttl_floor)
end
if op == LEASE.DROP then
  if call('ZREM', KEYS[1], ARGV[4]) == 0 then return 0 end
  call('HDEL', KEYS[2], ARGV[4])
  if fk then cc_forget(KEYS[2], fk, {ARGV[4]}) end
  cc_expire(KEYS[1], KEYS[2], now, ttl_floor, tonumber(call('HGET', KEYS[2], '~blk')) or 0)
  return 1
end
-- LEASE.RELEASE: a release reclaims what it needs to itself (cc_release).
return cc_release(KEYS[1], KEYS[2], ARGV[4], tonumber(ARGV[5]), now, ttl_floor, fk)
