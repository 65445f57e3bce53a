-- wrk script: KServe v2 binary-extension inference requests.
--   ES_WRK_BODY=body.bin [ES_WRK_HLEN=N] wrk -s scripts/bench/wrk/v2_infer.lua URL
--   wrk -s scripts/bench/wrk/v2_infer.lua URL -- body.bin [N]
-- The body is a JSON inference header followed by raw tensor bytes
-- (scripts/ort/make_v2_body.js writes one, and its header length next to it
-- in body.bin.hlen, used when N is not given). Every request is the same
-- POST with Content-Type application/octet-stream and
-- Inference-Header-Content-Length: N. ES_WRK_DELAY_MS=D paces each connection
-- (D ms before each request).
-- done() prints one machine-readable line:
--   ES_WRK requests=.. duration_s=.. rps=.. non2xx=.. connect=.. read=..
--          write=.. timeout=.. p50_ms=.. p90_ms=.. p99_ms=.. max_ms=.. mean_ms=..
-- non2xx is wrk's errors.status (responses with status >= 400, e.g. 429).
-- ES_WRK_STATUS=1 also counts responses by status (statuses=200:n,429:m);
-- it makes wrk hand every response body to Lua, which costs client CPU, so
-- it is off by default.

local function read_file(p)
  local f, err = io.open(p, "rb")
  if not f then error("v2_infer.lua: cannot open body file: " .. tostring(err)) end
  local s = f:read("*a")
  f:close()
  return s
end

local function trim(s) return (s:gsub("^%s+", ""):gsub("%s+$", "")) end

local function configure(path, hlen)
  if not path or path == "" then
    error("v2_infer.lua: give the body file in ES_WRK_BODY or as `-- BODY [HLEN]`")
  end
  if not hlen or hlen == "" then hlen = trim(read_file(path .. ".hlen")) end
  if not tonumber(hlen) then error("v2_infer.lua: header length '" .. hlen .. "' is not a number") end
  wrk.method = "POST"
  wrk.body = read_file(path)
  wrk.headers["Content-Type"] = "application/octet-stream"
  wrk.headers["Inference-Header-Content-Length"] = hlen
end

-- Top level runs in every thread's Lua state and in the main one.
local env_body = os.getenv("ES_WRK_BODY")
if env_body and env_body ~= "" then configure(env_body, os.getenv("ES_WRK_HLEN")) end

function init(args)
  if args[1] then configure(args[1], args[2]) end
end

-- ES_WRK_DELAY_MS=D: each connection waits D ms before each request (an open
-- pace instead of a closed loop: the transport floor at the server's rate).
local delay_ms = tonumber(os.getenv("ES_WRK_DELAY_MS") or "")
if delay_ms and delay_ms > 0 then
  function delay() return delay_ms end
end

local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

if os.getenv("ES_WRK_STATUS") == "1" then
  statuses = {}
  function response(status, headers, body)
    statuses[status] = (statuses[status] or 0) + 1
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  local secs = summary.duration / 1e6
  local line = string.format(
    "ES_WRK requests=%d duration_s=%.3f rps=%.3f non2xx=%d connect=%d read=%d write=%d " ..
    "timeout=%d p50_ms=%.3f p90_ms=%.3f p99_ms=%.3f max_ms=%.3f mean_ms=%.3f",
    summary.requests, secs, summary.requests / secs, e.status, e.connect, e.read, e.write,
    e.timeout, latency:percentile(50) / 1e3, latency:percentile(90) / 1e3,
    latency:percentile(99) / 1e3, latency.max / 1e3, latency.mean / 1e3)
  if os.getenv("ES_WRK_STATUS") == "1" then
    local all = {}
    for _, t in ipairs(threads) do
      local s = t:get("statuses")
      if s then for k, v in pairs(s) do all[k] = (all[k] or 0) + v end end
    end
    local keys = {}
    for k in pairs(all) do table.insert(keys, k) end
    table.sort(keys)
    local out = {}
    for _, k in ipairs(keys) do table.insert(out, k .. ":" .. all[k]) end
    line = line .. " statuses=" .. table.concat(out, ",")
  end
  io.write(line .. "\n")
end
