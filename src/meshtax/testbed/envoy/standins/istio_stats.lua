-- Stand-in for Istio's stats filter (istio/proxy extensions/stats, "istio.stats"): not in
-- upstream Envoy, so meshtax profiles this Lua filter doing the same per-request work: build
-- the standard label set of the request (reporter, source and destination workload from the
-- peer metadata, protocol, response code, gRPC status, security policy, response flags) and
-- update Istio's four standard metrics under it: istio_requests_total, and one bucket each of
-- istio_request_duration_milliseconds, istio_request_bytes and istio_response_bytes.
-- The counts live in a Lua table per worker instead of Envoy's stats store (Istio's native
-- filter uses the store's symbol table); nothing is exported. See docs/config-import.md.
local metrics = {}
local BUCKETS = {0.5, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000}

local function bucket(v)
  for _, b in ipairs(BUCKETS) do
    if v <= b then
      return b
    end
  end
  return "+Inf"
end

local function bump(name)
  metrics[name] = (metrics[name] or 0) + 1
end

function envoy_on_request(request_handle)
  local headers = request_handle:headers()
  local size = tonumber(headers:get("content-length") or "0") or 0
  local meta = request_handle:streamInfo():dynamicMetadata()
  meta:set("istio.stats", "start", os.clock())
  meta:set("istio.stats", "request_bytes", size)
end

function envoy_on_response(response_handle)
  local headers = response_handle:headers()
  local info = response_handle:streamInfo()
  local peer = info:dynamicMetadata():get("istio.peer")
  local mine = info:dynamicMetadata():get("istio.stats") or {}
  local labels = table.concat({
    "reporter=destination",
    "source_workload=" .. ((peer and peer.id) or "unknown"),
    "source_workload_namespace=default",
    "destination_workload=meshtax-echo",
    "destination_workload_namespace=default",
    "destination_service=meshtax-echo.default.svc.cluster.local",
    "request_protocol=" .. (info:protocol() or "unknown"),
    "response_code=" .. (headers:get(":status") or "0"),
    "grpc_response_status=" .. (headers:get("grpc-status") or ""),
    "connection_security_policy=unknown",
    "response_flags=-",
  }, ",")
  local ms = (os.clock() - (mine.start or os.clock())) * 1000
  local bytes = tonumber(headers:get("content-length") or "0") or 0
  bump("istio_requests_total{" .. labels .. "}")
  bump("istio_request_duration_milliseconds_bucket{" .. labels .. ",le=" .. bucket(ms) .. "}")
  bump("istio_request_bytes_bucket{" .. labels .. ",le=" .. bucket(mine.request_bytes or 0) .. "}")
  bump("istio_response_bytes_bucket{" .. labels .. ",le=" .. bucket(bytes) .. "}")
end
