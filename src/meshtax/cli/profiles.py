"""Commands over the profile store: profiles list, show, export, import, delete."""

from __future__ import annotations

import json

import click

from meshtax.app import UsageError
from meshtax.app import data as app_data
from meshtax.cli._common import (
    NONNEG,
    POSITIVE,
    db_option,
    emit,
    format_option,
    main,
    output_option,
    user_errors,
)
from meshtax.report.exporters import EXPORTERS
from meshtax.report.microarch import microarch_document
from meshtax.report.text import profile_text, profiles_text
from meshtax.store.sqlite import ProfileStore


@main.group()
def profiles() -> None:
    """List, show, export and import stored profiles."""


@profiles.command("list")
@db_option
@click.option(
    "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True
)
@user_errors
def profiles_list(db: str | None, fmt: str) -> None:
    """Every stored profile, and the bundled reference."""
    store = ProfileStore(db)
    rows = store.list()
    for bad, why in store.unusable:
        click.echo(f"warning: stored profile {bad!r} is not usable, not listed: {why}", err=True)
    if fmt == "json":
        click.echo(
            json.dumps(
                [
                    {
                        "name": r.name,
                        "source": r.source,
                        "created": r.created,
                        "modes": r.modes,
                        "filters": r.filters,
                        "platform": r.platform.to_dict(),
                        "bundled": r.bundled,
                    }
                    for r in rows
                ],
                indent=2,
            )
        )
    else:
        click.echo(profiles_text(rows), nl=False)


@profiles.command("show")
@click.argument("name")
@db_option
@format_option
@click.option(
    "--size",
    type=NONNEG,
    default=100.0,
    show_default=True,
    help="Message size (bytes) of the table.",
)
@click.option(
    "--rate",
    type=POSITIVE,
    default=30000.0,
    show_default=True,
    help="Rate (requests/s) for CPU in vCPU.",
)
@click.option(
    "--microarch",
    is_flag=True,
    help="Instead: instructions, cache misses and branches per request (`profile --microarch`).",
)
@user_errors
def profiles_show(
    name: str, db: str | None, fmt: str, size: float, rate: float, microarch: bool
) -> None:
    """The component breakdown of profile NAME (the paper's Table 2 layout)."""
    p = ProfileStore(db).get(name)
    if microarch:
        if p.microarch is None:
            raise UsageError(
                f"profile {name!r} has no microarchitectural part; measure one with "
                f"`meshtax profile --microarch --base {name}`"
            )
        click.echo(microarch_document(p.microarch, fmt), nl=False)
        return
    click.echo(
        profile_text(p, size, rate) if fmt == "table" else EXPORTERS[fmt].export(p.to_dict()),
        nl=False,
    )


@profiles.command("export")
@click.argument("name")
@db_option
@output_option
@click.option(
    "--format", "fmt", type=click.Choice(["json", "csv"]), default="json", show_default=True
)
@user_errors
def profiles_export(name: str, db: str | None, output: str | None, fmt: str) -> None:
    """Write profile NAME as a self-describing document (JSON, with samples) or CSV."""
    emit(EXPORTERS[fmt].export(ProfileStore(db).get(name).to_dict()), output)


@profiles.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--name", help="Store under this name instead of the document's.")
@click.option("--replace", is_flag=True, help="Replace a stored profile of the same name.")
@db_option
@user_errors
def profiles_import(file: str, name: str | None, replace: bool, db: str | None) -> None:
    """Import a profile exported with `meshtax profiles export`."""
    p = app_data.import_profile(file, ProfileStore(db), name, replace)
    click.echo(f"imported profile {p.name!r} ({p.provenance.source}, {p.platform.describe()})")


@profiles.command("delete")
@click.argument("name")
@db_option
@user_errors
def profiles_delete(name: str, db: str | None) -> None:
    """Delete stored profile NAME."""
    ProfileStore(db).delete(name)
    click.echo(f"deleted {name!r}")
