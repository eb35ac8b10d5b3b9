"""``meshtax predict``'s tail-latency options: :func:`tail_options` adds them and
:func:`tail_request` reads them back as one :class:`~meshtax.app.tail.TailRequest` (None when
none of them was given), so the predict command's signature stays as it was."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TextIO, TypeVar

import click

from meshtax.app.tail import (
    DEFAULT_PERCENTILES,
    MAX_SAMPLES,
    TailRequest,
    parse_percentiles,
    parse_sweep,
)
from meshtax.cli._common import Number

F = TypeVar("F", bound=Callable[..., Any])
KEY = "meshtax_tail"


def _keep(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    if param.name is not None:
        ctx.meta.setdefault(KEY, {})[param.name] = value
    return value


def _option(*decls: str, **kw: Any) -> Callable[[F], F]:
    return click.option(*decls, expose_value=False, callback=_keep, **kw)


OPTIONS = (
    _option(
        "--percentiles",
        help="Tail latency under load: these percentiles (e.g. 50,90,99,99.9) of end-to-end "
        "latency with and without the mesh, the overhead at each with its interval, each "
        "sidecar's utilisation and where it saturates (a queueing model per sidecar).",
    ),
    _option(
        "--sweep-rate",
        is_flag=False,
        flag_value="auto",
        metavar="LO:HI:N",
        help="Also the overhead percentiles at N request rates from LO to HI requests/s (every "
        "call's rate scaled alike), the knee marked; alone: up to just below the first "
        "saturation.",
    ),
    _option(
        "--threshold",
        type=Number(0.0, open_lo=True, hi=1.0),
        help="Utilisation below 1 at which a sidecar counts as saturating (default 0.8).",
    ),
    _option(
        "--arrivals",
        type=click.Choice(["poisson", "even"]),
        help="How requests arrive: independent clients (poisson, the default) or evenly spaced "
        "(a load generator spreading its calls).",
    ),
    _option(
        "--workers",
        type=click.IntRange(1, 4096),
        help="Worker threads per sidecar (default: the profile's measured sidecar's, else 1).",
    ),
    _option(
        "--app-cpu-us",
        type=Number(0.0, hi=1e9),
        help="With --pod-cpus: the applications' CPU-µs per request without the mesh, so their "
        "own waits on the busier CPUs count too.",
    ),
    _option(
        "--samples",
        type=click.IntRange(20, MAX_SAMPLES),
        help="Monte Carlo draws per graph (4000).",
    ),
)


def tail_options(fn: F) -> F:
    """The tail options on a command (their values go to the click context, not arguments)."""
    for o in reversed(OPTIONS):
        fn = o(fn)
    return fn


def tail_request(ctx: click.Context) -> TailRequest | None:
    """The :class:`TailRequest` the options ask for; None when neither --percentiles nor
    --sweep-rate was given (the others then change nothing, and say so)."""
    v: dict[str, Any] = ctx.meta.get(KEY, {})
    if v.get("percentiles") is None and v.get("sweep_rate") is None:
        given = [k for k, x in v.items() if x is not None]
        if given:
            raise click.UsageError(
                f"--{given[0].replace('_', '-')} needs --percentiles or --sweep-rate"
            )
        return None
    req = TailRequest(
        percentiles=(
            parse_percentiles(v["percentiles"]) if v.get("percentiles") else DEFAULT_PERCENTILES
        ),
        sweep=None if v.get("sweep_rate") is None else parse_sweep(v["sweep_rate"]),
    )
    changes: dict[str, Any] = {}
    for k in ("threshold", "workers", "app_cpu_us", "samples"):
        if v.get(k) is not None:
            changes[k] = v[k]
    if v.get("arrivals") is not None:
        changes["arrivals"] = 1.0 if v["arrivals"] == "poisson" else 0.0
    return TailRequest(**{**req.to_dict(), **changes}) if changes else req


def export(fmt: str, doc: dict[str, Any], out: TextIO) -> None:
    """A prediction document in ``fmt`` to ``out``; CSV of a document with tail parts is
    their CSV."""
    from meshtax.report.exporters import EXPORTERS
    from meshtax.report.tail import tail_csv

    if fmt == "csv" and ("tail" in doc or "tail_sweep" in doc):
        out.write(tail_csv(doc))
    else:
        EXPORTERS[fmt].write(doc, out)
