"""``meshtax doctor``: what profiling needs on this machine, checked (and, asked, prepared)."""

from __future__ import annotations

import json
import sys

import click

from meshtax.cli._common import main, user_errors


@main.command()
@click.option(
    "--prepare",
    is_flag=True,
    help="Also fix what can be fixed here: mount tracefs/bpffs, raise the memlock limit.",
)
@click.option(
    "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True
)
@user_errors
def doctor(prepare: bool, fmt: str) -> None:
    """Check what profiling needs (root, BTF, memlock, netns, iptables, Envoy, fortio, perf, the
    probe build) and attach the real probe for a moment; HAProxy and nginx (--proxy) are
    optional."""
    from meshtax.app.measure import check_machine

    changed, checks = check_machine(prepare)
    for change in changed:
        click.echo(f"prepared: {change}")
    if fmt == "json":
        rows = [
            {"name": c.name, "ok": c.ok, "detail": c.detail, "fix": c.fix, "optional": c.optional}
            for c in checks
        ]
        click.echo(json.dumps(rows, indent=2))
    else:
        for c in checks:
            fix = "" if c.ok else f"\n        fix: {c.fix}"
            state = "ok " if c.ok else "optional" if c.optional else "MISSING"
            click.echo(f"{state} {c.name}: {c.detail}{fix}")
    if not all(c.ok or c.optional for c in checks):
        sys.exit(1)
