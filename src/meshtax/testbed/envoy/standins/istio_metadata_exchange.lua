-- Stand-in for Istio's HTTP metadata exchange (istio/proxy extensions/metadata_exchange,
-- "istio.metadata_exchange" / peer_metadata): not in upstream Envoy, so meshtax profiles this
-- Lua filter doing the same per-request header work. Inbound, Istio reads and removes the
-- caller's x-envoy-peer-metadata(-id) request headers, keeps the peer in filter state, and
-- adds its own node metadata (base64 of a protobuf Struct, ~0.5 KB) to the response.
-- Not done here: decoding the protobuf (Istio does it in C++; the peer header is absent in
-- the testbed anyway). See docs/config-import.md ("istio-default").
local ID = "sidecar~10.44.0.2~meshtax-echo-5d8f7c9b7-x2x4q.default~default.svc.cluster.local"
local MD = string.rep(
  "ChsKDkFQUF9DT05UQUlORVJTEgkaB21lc2h0YXgKGgoKQ0xVU1RFUl9JRBIMGgpLdWJlcm5ldGVz", 7)

function envoy_on_request(request_handle)
  local headers = request_handle:headers()
  local peer = headers:get("x-envoy-peer-metadata-id")
  if headers:get("x-envoy-peer-metadata") ~= nil then
    headers:remove("x-envoy-peer-metadata")
  end
  if peer ~= nil then
    headers:remove("x-envoy-peer-metadata-id")
  end
  request_handle:streamInfo():dynamicMetadata():set("istio.peer", "id", peer or "unknown")
end

function envoy_on_response(response_handle)
  local headers = response_handle:headers()
  headers:add("x-envoy-peer-metadata", MD)
  headers:add("x-envoy-peer-metadata-id", ID)
end
