"""Attribution of the microarchitectural profile's counts to parsing, filters and other, by
function name (a proxy binary with symbols, or a symbol map of a stripped one)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from meshtax.testbed.callgrind import SymbolMap, load_base

__all__ = ["NAMED_ENOUGH", "PARTS", "Attribution", "attribution_for", "classify"]

PARTS = ("parsing", "filters", "other")
#: attribution is kept when names cover at least this share of the instructions
NAMED_ENOUGH = 0.5
_PARSING = re.compile(
    r"Http1::|Http2::|http_parser|llhttp|nghttp2|http2::adapter|oghttp2|Balsa|"
    r"HeaderMapImpl|HeaderString|Grpc::Common|Grpc::Codec"
)
# the HTTP connection manager, the router and tcp_proxy are the base sidecar: "other"
_FILTERS = re.compile(
    r"Extensions::Filters::Http::(?!Router)|Extensions::Filters::Common::(RBAC|Lua)|"
    r"Extensions::Filters::Network::(Rbac|RBAC|LocalRateLimit)|Extensions::Common::(Wasm|Tap)|"
    r"Extensions::AccessLoggers|proxy_wasm|v8::|\blua_|\bluaL_|\blj_"
)


def classify(function: str) -> str:
    """``parsing``, ``filters`` or ``other`` for a (demangled) function name."""
    if _FILTERS.search(function):
        return "filters"
    if _PARSING.search(function):
        return "parsing"
    return "other"


@dataclass(frozen=True)
class Attribution:
    """How function costs are named: the proxy binary's path as callgrind reports its object,
    the run-time address it is loaded at, and a symbol map of it (for a stripped binary)."""

    binary: str
    base: int | None = None
    symbols: SymbolMap | None = None

    def name(self, ob: str, fn: str) -> str | None:
        """The function's name; None for an address in the proxy that nothing names."""
        if not fn.startswith("0x"):
            return fn
        if ob != self.binary or self.symbols is None or self.base is None:
            return None if ob == self.binary else fn
        return self.symbols.name(int(fn, 16) - self.base)

    def split(
        self, functions: Mapping[tuple[str, str], Mapping[str, float]], event: str = "Ir"
    ) -> tuple[dict[str, dict[str, float]], float]:
        """Events per part, and the share of ``event`` that had a name (the rest is "other")."""
        parts: dict[str, dict[str, float]] = {p: {} for p in PARTS}
        named = total = 0.0
        for (ob, fn), cost in functions.items():
            name = self.name(ob, fn)
            part = "other" if name is None else classify(name)
            total += cost.get(event, 0.0)
            named += cost.get(event, 0.0) if name is not None else 0.0
            acc = parts[part]
            for e, v in cost.items():
                acc[e] = acc.get(e, 0.0) + v
        return parts, (named / total if total else 0.0)


def attribution_for(binary: Path, symbols: SymbolMap | None) -> Callable[[int], Attribution]:
    """Given Envoy's PID: its functions named from the binary's own symbols (callgrind reads
    them) or, for a stripped binary, from ``symbols`` at the address it is loaded at."""
    real = os.path.realpath(binary)

    def make(pid: int) -> Attribution:
        return Attribution(real, load_base(pid, real) if symbols is not None else None, symbols)

    return make
