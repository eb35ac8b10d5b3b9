"""``meshtax whatif study``: the paper's Figures 13/14 from profiles measured on this machine."""

from __future__ import annotations

import math

import click

from meshtax.app import UsageError
from meshtax.app import data as app_data
from meshtax.cli._common import (
    POSITIVE,
    accept_unclosed_option,
    db_option,
    report_option,
    stderr,
    user_errors,
)
from meshtax.cli.predict import whatif
from meshtax.errors import clip
from meshtax.report.whatif import whatif_rows
from meshtax.store.sqlite import ProfileStore


def _pairs(items: tuple[str, ...], what: str) -> list[tuple[str, str]]:
    out = []
    for it in items:
        key, sep, value = it.partition("=")
        if not sep or not key or not value:
            raise UsageError(f"{what}: expected KEY=VALUE, got {it!r}")
        out.append((key, value))
    return out


def _bytes(text: str) -> float:
    """A message size of ``--store``: a finite number of bytes above 0."""
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not (0.0 < v <= 1e12):  # NaN fails too
        raise UsageError(
            f"--store: BYTES must be a size in bytes, e.g. 100=store-100B (got {clip(text)})"
        )
    return v


@whatif.command("study")
@click.option("--base", required=True, help="The baseline profile (e.g. loopback TCP).")
@click.option(
    "--variant",
    "variants",
    multiple=True,
    required=True,
    metavar="LABEL=PROFILE",
    help="A profile of one optimization (repeatable), e.g. uds=rs-uds, zerocopy=rs-zc; "
    "uds and zerocopy are compared with the paper's numbers.",
)
@click.option(
    "--store",
    "stores",
    multiple=True,
    required=True,
    metavar="BYTES=DIR",
    help="A trace store imported at that message size (repeatable), e.g. 100=store-100B.",
)
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False))
@click.option(
    "--mode", type=click.Choice(["tcp", "http", "grpc"]), default="tcp", show_default=True
)
@click.option(
    "--rate", type=POSITIVE, help="Requests/s of the CPU ratios (default: each model's highest)."
)
@report_option
@accept_unclosed_option
@db_option
@user_errors
def whatif_study(
    base: str,
    variants: tuple[str, ...],
    stores: tuple[str, ...],
    out_dir: str,
    mode: str,
    rate: float | None,
    report_path: str | None,
    accept_unclosed: bool,
    db: str | None,
) -> None:
    """Derive each variant's speedup over BASE at each size, study every call graph with it,
    and print the reductions of the mean latency and CPU overhead next to the paper's."""
    from meshtax.app.whatif import WhatifStudyOptions
    from meshtax.app.whatif import whatif_study as run
    from meshtax.model.sidecar import Mode

    by_size = {_bytes(k): v for k, v in _pairs(stores, "--store")}
    opts = WhatifStudyOptions(
        by_size,
        base,
        dict(_pairs(variants, "--variant")),
        out_dir,
        mode=Mode(mode),
        rate=rate,
        accept_unclosed=accept_unclosed,
    )
    store = ProfileStore(db)
    doc = run(opts, store, say=stderr)
    for w in doc["warnings"]:
        click.echo(f"warning: {w}", err=True)
    head = ("variant", "size", "latency µs", "reduction", "paper", "CPU vCPU", "reduction", "paper")
    click.echo(" | ".join(head))
    for row in whatif_rows(doc):
        click.echo(" | ".join(row))
    click.echo(f"wrote {out_dir}/whatif-study.json", err=True)
    if report_path:
        path = f"{out_dir}/whatif-study.json"
        click.echo(f"wrote {app_data.build_report([path], [], store, report_path)}", err=True)
