-- GCRA decisions, one per request: a call carries one request, or several
-- on one server (package internal/batch joins concurrent ones), each
-- decided on its own key, in order. Composed after
-- internal/script/lua/gcra.lua.
--
-- KEYS[i]  request i's state key; its value is the TAT in microseconds
-- ARGV[1]  number of requests; then 7 arguments per request:
--   +1     emission interval T, microseconds (integer >= 1)
--   +2     burst B (integer >= 1)
--   +3     cost n (integer >= 0; 0 peeks)
--   +4     op: 0 allow, 1 reserve, 2 refund
--   +5     reserve horizon, microseconds
--   +6     explicit now in microseconds, or -1 for the server's TIME (read
--          once per call)
--   +7     TTL floor in milliseconds
--
-- Reply: per request {allowed, remaining, retry_after_us, reset_after_us,
--   delay_us, now_us}; retry_after_us is -1 when the cost exceeds the
--   burst (never allowed).
local out, server = {}, nil
for i = 1, tonumber(ARGV[1]) do
  local a = 1 + 7 * (i - 1)
  local now = tonumber(ARGV[a + 6])
  if now < 0 then
    server = server or gcra_now(-1)
    now = server
  end
  local key = KEYS[i]
  local allowed, tat, write, remaining, retry, reset, delay = gcra_decide(
    tonumber(call('GET', key)), now, tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]),
    tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5]))
  gcra_store(key, tat, write, now, tonumber(ARGV[a + 7]))
  out[i] = {allowed, remaining, retry, reset, delay, now}
end
return out
