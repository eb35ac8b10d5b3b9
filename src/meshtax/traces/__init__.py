"""meshtax.traces: importers (Jaeger, OTLP, Zipkin, Alibaba v2021/v2022), the synthetic
Alibaba-like generator, and the partitioned Parquet store of ingested call graphs.

Heavy optional parts (pyarrow, opentelemetry-proto) are imported on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "FORMATS",
    "AlibabaOptions",
    "GenerateSummary",
    "ImportReport",
    "ImportResult",
    "SpanOptions",
    "Store",
    "TraceFormatError",
    "detect_format",
    "generate",
    "ingest",
    "iter_batches",
    "iter_graph_batches",
    "load_service_map",
    "load_traces",
    "open_store",
    "write_store",
]

_WHERE = {
    "FORMATS": "api",
    "ImportResult": "api",
    "detect_format": "api",
    "ingest": "api",
    "iter_graph_batches": "api",
    "load_traces": "api",
    "AlibabaOptions": "alibaba",
    "TraceFormatError": "alibaba",
    "GenerateSummary": "synth",
    "generate": "synth",
    "ImportReport": "report",
    "SpanOptions": "spans",
    "iter_batches": "stream",
    "load_service_map": "spans",
    "Store": "store",
    "open_store": "store",
    "write_store": "store",
}


def __getattr__(name: str) -> Any:
    # lazy: `import meshtax.traces.ecg_file` must not pull in pyarrow
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError(f"module 'meshtax.traces' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"meshtax.traces.{mod}"), name)
