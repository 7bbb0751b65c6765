-- One GCRA decision on one key. Composed after internal/script/lua/gcra.lua.
--
-- KEYS[1]  the rule's state key; its value is the TAT in microseconds
-- ARGV[1]  emission interval T, microseconds (integer >= 1)
-- ARGV[2]  burst B (integer >= 1)
-- ARGV[3]  cost n (integer >= 0; 0 peeks)
-- ARGV[4]  op: 0 allow, 1 reserve, 2 refund                  (optional, 0)
-- ARGV[5]  reserve horizon, microseconds                     (optional, 0)
-- ARGV[6]  explicit now in microseconds, or -1 for TIME      (optional, -1)
-- ARGV[7]  TTL floor in milliseconds                         (optional, 0)
-- The optional arguments are left out on the hot path (an Allow on the
-- server's clock) to keep each call small.
--
-- Reply: {allowed, remaining, retry_after_us, reset_after_us, delay_us, now_us}
--   retry_after_us is -1 when the cost exceeds the burst (never allowed).
local now = gcra_now(ARGV[6] or -1)
local allowed, tat, write, remaining, retry, reset, delay = gcra_decide(
  tonumber(redis.call('GET', KEYS[1])), now, tonumber(ARGV[1]), tonumber(ARGV[2]),
  tonumber(ARGV[3]), tonumber(ARGV[4] or 0), tonumber(ARGV[5] or 0))
gcra_store(KEYS[1], tat, write, now, tonumber(ARGV[7] or 0))
return {allowed, remaining, retry, reset, delay, now}
