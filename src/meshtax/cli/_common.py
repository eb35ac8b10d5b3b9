"""What every command shares: the group, common options, error mapping, small parsers."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from meshtax._version import __version__
from meshtax.app import UsageError
from meshtax.model.ecg import ECGError
from meshtax.model.sidecar import Mode
from meshtax.predict.engine import PredictionError
from meshtax.predict.whatif import SpeedupError
from meshtax.store.sqlite import StoreError

F = TypeVar("F", bound=Callable[..., Any])
V = TypeVar("V")
USER_ERRORS = (UsageError, ECGError, StoreError, PredictionError, SpeedupError)


def user_errors(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*a: Any, **kw: Any) -> Any:
        try:
            return fn(*a, **kw)
        except USER_ERRORS as e:
            click.echo(f"meshtax: error: {e}", err=True)
            sys.exit(2)

    return wrapper  # type: ignore[return-value]


def emit(text: str, output: str | None) -> None:
    if output:
        Path(output).write_text(text)
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(text, nl=False)


db_option = click.option(
    "--db",
    type=click.Path(dir_okay=False),
    help="Profile database (default: $MESHTAX_DB or the user data dir).",
)
format_option = click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json", "csv", "markdown", "html"]),
    default="table",
    show_default=True,
)
report_option = click.option(
    "--report",
    "report_path",
    type=click.Path(dir_okay=False),
    help="Also write a self-contained HTML report here.",
)
accept_unclosed_option = click.option(
    "--accept-unclosed",
    is_flag=True,
    help="Use a profile whose components did not add up to its measured overhead (refused "
    "otherwise); outputs say so.",
)


def speed_option(default: str) -> Callable[[F], F]:
    """``--speed profile|now``: scale the profile's costs to this machine's speed now."""
    return click.option(
        "--speed",
        type=click.Choice(["profile", "now"]),
        default=default,
        show_default=True,
        help="now: run the reference workload (≈2 s) and scale the profile's costs by how much "
        "faster or slower each kind of work runs now than when it was profiled (a profile of "
        "this machine); profile: its costs as measured.",
    )


output_option = click.option(
    "-o", "--output", type=click.Path(dir_okay=False), help="Write to this file instead of stdout."
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="meshtax")
def main() -> None:
    """What does a service mesh cost me? Profile sidecars; predict their overhead on call graphs."""


def stderr(msg: str) -> None:
    click.echo(msg, err=True)


def parse_modes(text: str) -> tuple[Mode, ...]:
    """``tcp,http`` → modes (empty text: none)."""
    try:
        return tuple(Mode(m.strip()) for m in text.split(",") if m.strip())
    except ValueError as e:
        raise UsageError(f"--modes: {e}; expected e.g. tcp,http,grpc") from None


def csv(text: str, conv: Callable[[str], V]) -> tuple[V, ...]:
    """``"a,b"`` → ``(conv("a"), conv("b"))``; ``"none"`` (or empty) → ``()``."""
    if text.strip().lower() in ("", "none"):
        return ()
    return tuple(conv(x.strip()) for x in text.split(","))
