-- Library of the scripts that touch asynq's keys (park.lua, unpark.lua,
-- sweep_read.lua, sweep_move.lua): the time, and a walk over the
-- top-level fields of a protobuf-encoded TaskMessage (asynq v0.26,
-- internal/proto/asynq.proto) for the scripts that rewrite one in place.
-- Fields are kept byte for byte; only error_msg (field 7) and header
-- entries (field 15) whose key starts with "taskrl-" are taken out. A
-- message that does not parse is left as it is (tm_split returns nil).

-- tm_now(arg) returns arg when it is a non-negative explicit time, else the
-- server's TIME, in microseconds.
local function tm_now(arg)
  local now = tonumber(arg)
  if now >= 0 then return now end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- tm_varint(s, i) reads the varint at byte i: its value and the index
-- after it, or nil past the end. Values above 2^53 lose precision, which
-- only the skipped varint fields can hold.
local function tm_varint(s, i)
  local v, m = 0, 1
  while true do
    local b = string.byte(s, i)
    if not b then return nil end
    i = i + 1
    v = v + (b % 128) * m
    if b < 128 then return v, i end
    m = m * 128
  end
end

-- tm_key(entry) is the key (field 1) of a map<string, string> entry.
local function tm_key(e)
  local i = 1
  while i <= #e do
    local tag, j = tm_varint(e, i)
    if not tag then return nil end
    local num, typ = math.floor(tag / 8), tag % 8
    if typ ~= 2 then return nil end
    local n, k = tm_varint(e, j)
    if not n then return nil end
    if num == 1 then return string.sub(e, k, k + n - 1) end
    i = k + n
  end
  return ''
end

-- tm_split(msg, ours) returns the message without error_msg and, if ours,
-- without our header entries, and the last error_msg it held ('' if
-- none); nil if msg does not parse.
local function tm_split(msg, ours)
  local kept, err, i = {}, '', 1
  while i <= #msg do
    local tag, j = tm_varint(msg, i)
    if not tag then return nil end
    local num, typ = math.floor(tag / 8), tag % 8
    local stop
    if typ == 0 then
      local _, k = tm_varint(msg, j)
      stop = k
    elseif typ == 2 then
      local n, k = tm_varint(msg, j)
      if not n then return nil end
      stop = k + n
      if stop - 1 > #msg then return nil end
      if num == 7 then
        err = string.sub(msg, k, stop - 1)
      elseif num == 15 then
        local key = tm_key(string.sub(msg, k, stop - 1))
        if key == nil then return nil end
        if ours and string.sub(key, 1, 7) == 'taskrl-' then
          num = 7 -- dropped below like error_msg
        end
      end
    elseif typ == 1 then
      stop = j + 8
    elseif typ == 5 then
      stop = j + 4
    else
      return nil
    end
    if not stop or stop - 1 > #msg then return nil end
    if num ~= 7 then
      kept[#kept + 1] = string.sub(msg, i, stop - 1)
    end
    i = stop
  end
  return table.concat(kept), err
end

-- tm_string(num, s) encodes s as length-delimited field num (< 16).
local function tm_string(num, s)
  local n, out = #s, {string.char(num * 8 + 2)}
  while n >= 128 do
    out[#out + 1] = string.char(n % 128 + 128)
    n = math.floor(n / 128)
  end
  out[#out + 1] = string.char(n)
  out[#out + 1] = s
  return table.concat(out)
end
