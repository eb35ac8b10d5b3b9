"""The filter catalogue: Envoy configs of the filters meshtax profiles, each as a component.

Every filter is configured to do its normal per-request work but never change the outcome
(fault injection at 0 %, a rate limit never reached, RBAC rules that never deny …), so a
profile "with minus without" measures the filter's cost and nothing else. Component names are
canonical: the filter name, then its size where it has one (``rbac_http_1000``,
``ip_tagging_5``).

Pure except :func:`filter_config` for ``wasm``, which assembles the no-op module on first use
(see :mod:`meshtax.testbed.envoy.wasm`) unless its bytes are passed in.
"""

from __future__ import annotations

import base64
import dataclasses
import ipaddress
import re
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Any

from meshtax.model.components import sized  # the one spelling, shared with config import
from meshtax.model.presets import STAND_INS
from meshtax.model.sidecar import Mode
from meshtax.testbed.envoy.config import EnvoyConfig

__all__ = [
    "CPP_FILTERS",
    "COMBINATIONS",
    "FILTERS",
    "MIXES",
    "RBAC_RULES",
    "IP_TAGS",
    "SAHU_MIXES",
    "FilterSpec",
    "catalogue",
    "combination",
    "combine",
    "component_name",
    "filter_config",
    "modes_for",
    "parse_component",
]

T = "type.googleapis.com/envoy.extensions."

RBAC_RULES = (1, 100, 1000, 10_000)
IP_TAGS = (1, 5, 10)
# the size parameter of the filters that have one (it becomes the name suffix)
SIZE_PARAM = {"rbac_http": "rules", "rbac_network": "rules", "ip_tagging": "tags"}
SIZES: dict[str, tuple[int, ...]] = {
    "rbac_http": RBAC_RULES,
    "rbac_network": RBAC_RULES,
    "ip_tagging": IP_TAGS,
}
FILTERS = (
    "fault_injection",
    "rate_limit",
    "tap",
    "lua",
    "wasm",
    "rbac_http",
    "rbac_network",
    "ip_tagging",
    "header_mutation",
    "access_log",
    *STAND_INS,
)
# compiled into Envoy, as opposed to the Lua and Wasm extension runtimes (the paper's split)
CPP_FILTERS = ("fault_injection", "rate_limit", "tap")

# the paper's additivity study: five filters in five combinations, chain order as listed
COMBINATIONS: dict[str, tuple[str, ...]] = {
    "cpp": CPP_FILTERS,
    "lua+wasm": ("lua", "wasm"),
    "lua+cpp": ("lua", *CPP_FILTERS),
    "wasm+cpp": ("wasm", *CPP_FILTERS),
    "all5": ("lua", "wasm", *CPP_FILTERS),
}
# RBAC and IP-tagging mixes: does a big policy plus a tagger cost the sum of the two?
MIXES: dict[str, tuple[str, ...]] = {
    "rbac_http_1+ip_tagging_1": ("rbac_http_1", "ip_tagging_1"),
    "rbac_http_100+ip_tagging_5": ("rbac_http_100", "ip_tagging_5"),
    "rbac_http_1000+ip_tagging_10": ("rbac_http_1000", "ip_tagging_10"),
    "rbac_http_10000+ip_tagging_10": ("rbac_http_10000", "ip_tagging_10"),
    "rbac_network_1000+rbac_http_1000": ("rbac_network_1000", "rbac_http_1000"),
}
# Sahu et al.'s two HTTP mixes (header processing, rate limit, IP tag, logging): mix 1 is
# rate limit + IP tag (its published filter estimate is their sum), mix 2 all four
SAHU_MIXES: dict[str, tuple[str, ...]] = {
    "http_mix_1": ("rate_limit", "ip_tagging_1"),
    "http_mix_2": ("header_mutation", "rate_limit", "ip_tagging_1", "access_log"),
}


@dataclass(frozen=True)
class FilterSpec:
    """What one filter (or a combination) adds to a sidecar's config.

    ``outputs``: files or path prefixes the filter writes (tap, access log), so a caller can
    create their directory for the proxy's UID and remove them afterwards.
    """

    name: str
    http_filters: tuple[Mapping[str, Any], ...] = ()
    network_filters: tuple[Mapping[str, Any], ...] = ()
    hcm_patch: Mapping[str, Any] = field(default_factory=dict)
    outputs: tuple[str, ...] = ()
    modes: frozenset[Mode] = frozenset({Mode.HTTP, Mode.GRPC})

    def apply(self, cfg: EnvoyConfig) -> EnvoyConfig:
        """``cfg`` with this spec's filters appended after the ones it already has."""
        if cfg.mode not in self.modes:
            raise ValueError(
                f"{self.name} needs mode {'/'.join(sorted(m.value for m in self.modes))}, not {cfg.mode.value}"
            )
        patch = dict(cfg.hcm_patch)
        for k, v in self.hcm_patch.items():
            patch[k] = list(patch[k]) + list(v) if isinstance(v, list) and k in patch else v
        return dataclasses.replace(
            cfg,
            http_filters=cfg.http_filters + self.http_filters,
            network_filters=cfg.network_filters + self.network_filters,
            hcm_patch=patch,
        )


def component_name(name: str, params: Mapping[str, Any] | None = None) -> str:
    """``("rbac_http", {"rules": 1000})`` → ``rbac_http_1000``; unsized filters keep their name."""
    if name not in FILTERS:
        raise ValueError(f"unknown filter {name!r}; known: {', '.join(FILTERS)}")
    key = SIZE_PARAM.get(name)
    if key is None:
        return name
    params = params or {}
    if key not in params:
        raise ValueError(f"{name} needs {key}=N")
    return sized(name, int(params[key]))


_SIZED = re.compile(r"^(rbac_http|rbac_network|ip_tagging)_(\d+)$")


def parse_component(component: str) -> tuple[str, dict[str, Any]]:
    """``rbac_http_1000`` → ``("rbac_http", {"rules": 1000})``; the inverse of :func:`component_name`."""
    m = _SIZED.match(component)
    if m:
        return m.group(1), {SIZE_PARAM[m.group(1)]: int(m.group(2))}
    if component in FILTERS and component not in SIZE_PARAM:
        return component, {}
    raise ValueError(f"unknown filter component {component!r}")


def catalogue() -> list[tuple[str, dict[str, Any]]]:
    """Every profiled filter with its parameters, sized filters once per size, in order."""
    out: list[tuple[str, dict[str, Any]]] = []
    for f in FILTERS:
        key = SIZE_PARAM.get(f)
        if key is None:
            out.append((f, {}))
        else:
            out.extend((f, {key: n}) for n in SIZES[f])
    return out


def modes_for(name: str) -> frozenset[Mode]:
    """Modes a filter can run in: network RBAC in all three, the rest need HTTP (incl. gRPC)."""
    if name not in FILTERS:
        raise ValueError(f"unknown filter {name!r}")
    if name == "rbac_network":
        return frozenset(Mode)
    return frozenset({Mode.HTTP, Mode.GRPC})


# ---- one builder per filter ----------------------------------------------------------------


def _http(name: str, typ: str, body: Mapping[str, Any]) -> dict[str, Any]:
    return {"name": name, "typed_config": {"@type": T + typ, **body}}


def _pct(n: int) -> dict[str, Any]:
    return {"numerator": n, "denominator": "HUNDRED"}


def _fault(p: Mapping[str, Any]) -> FilterSpec:
    # both faults present and evaluated per request, at 0 %: they never fire
    body = {
        "abort": {"http_status": 503, "percentage": _pct(0)},
        "delay": {"fixed_delay": "1s", "percentage": _pct(0)},
    }
    return FilterSpec(
        "fault_injection",
        http_filters=(_http("envoy.filters.http.fault", "filters.http.fault.v3.HTTPFault", body),),
    )


def _rate_limit(p: Mapping[str, Any]) -> FilterSpec:
    # enabled and enforced on every request; a bucket of 1e9 tokens refilled each second
    tokens = int(p.get("tokens", 1_000_000_000))
    body = {
        "stat_prefix": "meshtax_rate_limit",
        "token_bucket": {"max_tokens": tokens, "tokens_per_fill": tokens, "fill_interval": "1s"},
        "filter_enabled": {"runtime_key": "meshtax_rl_enabled", "default_value": _pct(100)},
        "filter_enforced": {"runtime_key": "meshtax_rl_enforced", "default_value": _pct(100)},
    }
    f = _http(
        "envoy.filters.http.local_ratelimit", "filters.http.local_ratelimit.v3.LocalRateLimit", body
    )
    return FilterSpec("rate_limit", http_filters=(f,))


def _tap(p: Mapping[str, Any]) -> FilterSpec:
    # static config (no admin): every request/response pair is written as one JSON file
    prefix = str(p.get("path_prefix", f"{tempfile.gettempdir()}/meshtax-tap/tap"))
    body = {
        "common_config": {
            "static_config": {
                "match": {"any_match": True},
                "output_config": {
                    "sinks": [
                        {"format": "JSON_BODY_AS_BYTES", "file_per_tap": {"path_prefix": prefix}}
                    ]
                },
            }
        }
    }
    f = _http("envoy.filters.http.tap", "filters.http.tap.v3.Tap", body)
    return FilterSpec("tap", http_filters=(f,), outputs=(prefix,))


LUA_NOOP = "function envoy_on_request(request_handle)\nend\n"


def _lua(p: Mapping[str, Any]) -> FilterSpec:
    body = {"default_source_code": {"inline_string": str(p.get("code", LUA_NOOP))}}
    return FilterSpec(
        "lua", http_filters=(_http("envoy.filters.http.lua", "filters.http.lua.v3.Lua", body),)
    )


def _wasm(p: Mapping[str, Any]) -> FilterSpec:
    module = p.get("module")
    if module is None:
        from meshtax.testbed.envoy.wasm import noop_module

        module = noop_module()
    # inline: a proxy running as an unprivileged UID needs no access to our cache dir
    code = {"local": {"inline_bytes": base64.b64encode(bytes(module)).decode()}}
    body = {
        "config": {
            "name": "meshtax_noop",
            "vm_config": {
                "vm_id": "meshtax_noop",
                "runtime": str(p.get("runtime", "envoy.wasm.runtime.v8")),
                "code": code,
            },
        }
    }
    return FilterSpec(
        "wasm", http_filters=(_http("envoy.filters.http.wasm", "filters.http.wasm.v3.Wasm", body),)
    )


def _stand_in(name: str) -> Callable[[Mapping[str, Any]], FilterSpec]:
    """A Lua stand-in for a filter upstream Envoy lacks (Istio's telemetry, ``standins/``)."""

    def build(p: Mapping[str, Any]) -> FilterSpec:
        code = (files("meshtax.testbed.envoy") / "standins" / f"{name}.lua").read_text()
        return dataclasses.replace(_lua({"code": code}), name=name)

    return build


def _rules(p: Mapping[str, Any]) -> int:
    n = int(p.get("rules", 0))
    if n < 1:
        raise ValueError("rbac needs rules >= 1")
    return n


def _rbac_http(p: Mapping[str, Any]) -> FilterSpec:
    # a DENY policy whose N rules never match: every request is checked against all N and
    # allowed (an ALLOW policy would stop at its first match, hiding N)
    n = _rules(p)
    policies = {
        f"rule-{i:05d}": {
            "permissions": [
                {"header": {"name": "x-meshtax-deny", "string_match": {"exact": f"rule-{i:05d}"}}}
            ],
            "principals": [{"any": True}],
        }
        for i in range(n)
    }
    f = _http(
        "envoy.filters.http.rbac",
        "filters.http.rbac.v3.RBAC",
        {"rules": {"action": "DENY", "policies": policies}},
    )
    return FilterSpec(f"rbac_http_{n}", http_filters=(f,))


# RFC 2544 benchmarking range: never the address of a testbed pod or of loopback
_BENCH_NET = ipaddress.IPv4Network("198.18.0.0/15")


def _rbac_network(p: Mapping[str, Any]) -> FilterSpec:
    # as for HTTP: DENY rules on source addresses no pod ever has, checked per connection
    n = _rules(p)
    if n > _BENCH_NET.num_addresses:
        raise ValueError(f"at most {_BENCH_NET.num_addresses} network rules")
    base = int(_BENCH_NET.network_address)
    policies = {
        f"rule-{i:05d}": {
            "permissions": [{"any": True}],
            "principals": [
                {
                    "direct_remote_ip": {
                        "address_prefix": str(ipaddress.IPv4Address(base + i)),
                        "prefix_len": 32,
                    }
                }
            ],
        }
        for i in range(n)
    }
    f = {
        "name": "envoy.filters.network.rbac",
        "typed_config": {
            "@type": T + "filters.network.rbac.v3.RBAC",
            "stat_prefix": "meshtax_rbac",
            "rules": {"action": "DENY", "policies": policies},
        },
    }
    return FilterSpec(f"rbac_network_{n}", network_filters=(f,), modes=frozenset(Mode))


def _ip_tagging(p: Mapping[str, Any]) -> FilterSpec:
    # tag 0 covers every address, so each request is tagged (x-envoy-ip-tags written), as a
    # deployed tagger does; the other tags only grow the lookup trie
    n = int(p.get("tags", 0))
    if n < 1:
        raise ValueError("ip_tagging needs tags >= 1")
    tags: list[dict[str, Any]] = [
        {
            "ip_tag_name": f"tag-{i}",
            "ip_list": [{"address_prefix": f"198.18.{i}.0", "prefix_len": 24}],
        }
        for i in range(n)
    ]
    if p.get("matching", True):
        tags[0]["ip_list"].append({"address_prefix": "0.0.0.0", "prefix_len": 0})
    body = {"request_type": "BOTH", "ip_tags": tags}
    f = _http("envoy.filters.http.ip_tagging", "filters.http.ip_tagging.v3.IPTagging", body)
    return FilterSpec(f"ip_tagging_{n}", http_filters=(f,))


def _header_mutation(p: Mapping[str, Any]) -> FilterSpec:
    add = {
        "header": {
            "key": str(p.get("header", "x-meshtax-mutated")),
            "value": str(p.get("value", "1")),
        },
        "append_action": "APPEND_IF_EXISTS_OR_ADD",
    }
    body = {"mutations": {"request_mutations": [{"append": add}]}}
    f = _http(
        "envoy.filters.http.header_mutation", "filters.http.header_mutation.v3.HeaderMutation", body
    )
    return FilterSpec("header_mutation", http_filters=(f,))


def _access_log(p: Mapping[str, Any]) -> FilterSpec:
    path = str(p.get("path", f"{tempfile.gettempdir()}/meshtax-access.log"))
    log = {
        "name": "envoy.access_loggers.file",
        "typed_config": {"@type": T + "access_loggers.file.v3.FileAccessLog", "path": path},
    }
    return FilterSpec("access_log", hcm_patch={"access_log": [log]}, outputs=(path,))


_BUILDERS: dict[str, Callable[[Mapping[str, Any]], FilterSpec]] = {
    "fault_injection": _fault,
    "rate_limit": _rate_limit,
    "tap": _tap,
    "lua": _lua,
    "wasm": _wasm,
    "rbac_http": _rbac_http,
    "rbac_network": _rbac_network,
    "ip_tagging": _ip_tagging,
    "header_mutation": _header_mutation,
    "access_log": _access_log,
    **{n: _stand_in(n) for n in STAND_INS},
}


def filter_config(name: str, mode: Mode | str, **params: Any) -> FilterSpec:
    """The config of filter ``name`` (or a component name like ``rbac_http_1000``) for ``mode``.

    Parameters: ``rules`` (rbac_*), ``tags``/``matching`` (ip_tagging), ``path_prefix`` (tap),
    ``path`` (access_log), ``module`` bytes/``runtime`` (wasm), ``code`` (lua),
    ``tokens`` (rate_limit), ``header``/``value`` (header_mutation).
    """
    mode = Mode(mode)
    if name not in FILTERS:
        name, sized = parse_component(name)
        params = {**sized, **params}
    if mode not in modes_for(name):
        raise ValueError(f"{name} cannot run in {mode.value} mode")
    spec = _BUILDERS[name](params)
    return dataclasses.replace(spec, modes=modes_for(name))


def combine(specs: Sequence[FilterSpec], name: str | None = None) -> FilterSpec:
    """One spec chaining ``specs`` in order; usable in the modes all of them support."""
    if not specs:
        raise ValueError("nothing to combine")
    patch: dict[str, Any] = {}
    for s in specs:
        for k, v in s.hcm_patch.items():
            patch[k] = list(patch[k]) + list(v) if isinstance(v, list) and k in patch else v
    modes = frozenset.intersection(*(s.modes for s in specs))
    return FilterSpec(
        name or "+".join(s.name for s in specs),
        http_filters=tuple(f for s in specs for f in s.http_filters),
        network_filters=tuple(f for s in specs for f in s.network_filters),
        hcm_patch=patch,
        outputs=tuple(o for s in specs for o in s.outputs),
        modes=modes,
    )


def combination(
    components: Iterable[str], mode: Mode | str, name: str | None = None, **params: Any
) -> FilterSpec:
    """A chain of catalogue components, e.g. ``combination(COMBINATIONS["all5"], "http")``.

    ``params`` go to every filter that takes them (e.g. ``module=`` for wasm); sizes come from
    the component names.
    """
    specs = []
    for c in components:
        base, sized = parse_component(c)
        own = {k: v for k, v in params.items() if k in PARAMS[base]}
        specs.append(filter_config(base, mode, **{**own, **sized}))
    return combine(specs, name)


PARAMS: dict[str, frozenset[str]] = {
    "fault_injection": frozenset(),
    "rate_limit": frozenset({"tokens"}),
    "tap": frozenset({"path_prefix"}),
    "lua": frozenset({"code"}),
    "wasm": frozenset({"module", "runtime"}),
    "rbac_http": frozenset({"rules"}),
    "rbac_network": frozenset({"rules"}),
    "ip_tagging": frozenset({"tags", "matching"}),
    "header_mutation": frozenset({"header", "value"}),
    "access_log": frozenset({"path"}),
    **{n: frozenset() for n in STAND_INS},
}
