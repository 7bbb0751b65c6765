-- One GCRA decision on one key. Composed after internal/script/lua/gcra.lua.
--
-- KEYS[1]  the rule's state key; its value is the TAT in microseconds
-- ARGV[1]  emission interval T, microseconds (integer >= 1)
-- ARGV[2]  burst B (integer >= 1)
-- ARGV[3]  cost n (integer >= 0; 0 peeks)
-- ARGV[4]  op: 0 allow, 1 reserve, 2 refund
-- ARGV[5]  reserve horizon, microseconds
-- ARGV[6]  explicit now in microseconds, or -1 for the server's TIME
-- ARGV[7]  TTL floor in milliseconds (0 in production)
--
-- Reply: {allowed, remaining, retry_after_us, reset_after_us, delay_us, now_us}
--   retry_after_us is -1 when the cost exceeds the burst (never allowed).
local now = gcra_now(ARGV[6])
local allowed, tat, write, remaining, retry, reset, delay = gcra_decide(
  tonumber(redis.call('GET', KEYS[1])), now, tonumber(ARGV[1]), tonumber(ARGV[2]),
  tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]))
gcra_store(KEYS[1], tat, write, now, tonumber(ARGV[7]))
return {allowed, remaining, retry, reset, delay, now}
