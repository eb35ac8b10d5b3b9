"""What every command shares: the group, common options, error mapping, small parsers.

User errors (:class:`~meshtax.errors.MeshtaxError`, a missing tool, a busy testbed) print one
clear message and exit 2; anything else is a bug and prints one line and exits 70
(``--debug`` or ``$MESHTAX_DEBUG=1`` shows the traceback instead).
"""

from __future__ import annotations

import functools
import importlib
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO, TypeVar

import click

from meshtax import safeio
from meshtax._version import __version__
from meshtax.app import USER_ERRORS
from meshtax.errors import EXIT_INTERNAL, EXIT_USER, UsageError
from meshtax.model.sidecar import Mode

F = TypeVar("F", bound=Callable[..., Any])
V = TypeVar("V")
_DEBUG = [os.environ.get("MESHTAX_DEBUG", "") not in ("", "0")]


def user_errors(fn: F) -> F:
    """User errors → one line on stderr, exit 2; anything else → the last-resort line, exit 70."""

    @functools.wraps(fn)
    def wrapper(*a: Any, **kw: Any) -> Any:
        try:
            return fn(*a, **kw)
        except USER_ERRORS as e:
            click.echo(f"meshtax: error: {e}", err=True)
            sys.exit(EXIT_USER)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except BrokenPipeError:
            sys.exit(1)  # the reader went away (e.g. `| head`): nothing to say
        except OSError as e:
            if e.filename is None or _DEBUG[0]:
                raise
            click.echo(f"meshtax: error: {e.filename}: {e.strerror or e}", err=True)
            sys.exit(EXIT_USER)

    return wrapper  # type: ignore[return-value]


#: each top-level command → the modules that define it (and its subcommands), imported when
#: the command is asked for: ``meshtax predict`` does not import the measurement commands
COMMANDS: dict[str, tuple[str, ...]] = {
    "doctor": ("doctor",),
    "profile": ("measure",),
    "validate": ("measure",),
    "config": ("predict",),
    "example": ("predict",),
    "predict": ("predict",),
    "report": ("predict",),
    "study": ("predict",),
    "traces": ("predict",),
    "whatif": ("predict", "whatif"),
    "profiles": ("profiles",),
}


class _Main(click.Group):
    """The command group with the last-resort handler: an unexpected exception is a bug;
    say so in one line and exit 70, unless --debug asks for the traceback. Commands are
    registered by importing their module (:data:`COMMANDS`) when they are asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        for module in COMMANDS.get(cmd_name, ()):
            importlib.import_module(f"meshtax.cli.{module}")
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as e:
            if _DEBUG[0]:
                raise
            click.echo(
                f"meshtax: internal error: {e.__class__.__name__}: {str(e)[:200]}\n"
                "run with --debug for the traceback (and please report it)",
                err=True,
            )
            sys.exit(EXIT_INTERNAL)


class Number(click.ParamType):  # type: ignore[type-arg]
    """A finite float within bounds (NaN, infinities and out-of-range values are refused)."""

    name = "number"

    def __init__(self, lo: float | None = None, *, open_lo: bool = False, hi: float | None = None):
        self.lo, self.open_lo, self.hi = lo, open_lo, hi

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        try:
            v = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        want = (
            "a finite number"
            + ("" if self.lo is None else f" {'>' if self.open_lo else '≥'} {self.lo:g}")
            + ("" if self.hi is None else f" and ≤ {self.hi:g}")
        )
        bad = not math.isfinite(v) or (
            self.lo is not None and (v <= self.lo if self.open_lo else v < self.lo)
        )
        if bad or (self.hi is not None and v > self.hi):
            self.fail(f"{value!r}; expected {want}", param, ctx)
        return v


# upper bounds far beyond real values, so no product of them overflows a float
POSITIVE = Number(0.0, open_lo=True, hi=1e9)  # rates, seconds, MB
NONNEG = Number(0.0, hi=1e12)  # sizes in bytes, seconds to wait


def emit(text: str, output: str | None) -> None:
    if output:
        Path(output).write_text(text)
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(text, nl=False)


def emit_with(write: Callable[[TextIO], None], output: str | None) -> None:
    """``write(stream)`` to the file ``output``, or to stdout: a long export is written as it
    is made, never held whole."""
    if output:
        with open(output, "w") as f:
            write(f)
        click.echo(f"wrote {output}", err=True)
    else:
        write(sys.stdout)
        sys.stdout.flush()


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


def speed_option(default: str | None, note: str = "") -> Callable[[F], F]:
    """``--speed profile|now``: scale the profile's costs to this machine's speed now
    (``default`` None: the command decides, as ``note`` tells)."""
    return click.option(
        "--speed",
        type=click.Choice(["profile", "now"]),
        default=default,
        show_default=default is not None,
        help="now: run the reference workloads (≈7 s: speedref and a reference Envoy on "
        "loopback) and scale the profile's costs by how much faster or slower each kind of work "
        "runs now than when it was profiled (a profile of this machine); profile: its costs as "
        "measured." + (f" {note}" if note else ""),
    )


output_option = click.option(
    "-o", "--output", type=click.Path(dir_okay=False), help="Write to this file instead of stdout."
)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="meshtax")
@click.option("--debug", is_flag=True, help="Show the traceback of an unexpected error.")
@click.option(
    "--max-input-mb",
    type=POSITIVE,
    help="Largest input file read whole (ECG, profile, speedup, config; default 128, or "
    "$MESHTAX_MAX_INPUT_MB); compressed traces may expand to 100× their size or this.",
)
def main(debug: bool, max_input_mb: float | None) -> None:
    """What does a service mesh cost me? Profile sidecars; predict their overhead on call graphs."""
    _DEBUG[0] = _DEBUG[0] or debug
    if max_input_mb is not None:
        limit = int(max_input_mb * (1 << 20))
        safeio.set_limits(
            safeio.Limits(
                max_bytes=limit, min_decompressed=max(safeio.Limits().min_decompressed, limit)
            )
        )


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


def architecture_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--architecture``, ``--pods-per-node`` and the role profiles (predict)."""
    for role in ("waypoint", "node"):
        f = click.option(
            f"--{role}-profile",
            help=f"The profile measured as {'a waypoint' if role == 'waypoint' else 'node-l4'} "
            f"(`meshtax profile --architecture {'waypoint' if role == 'waypoint' else 'node-l4'}`"
            ") that prices those crossings (default: this machine's newest, if any; else the "
            "sidecar profile stands in).",
        )(f)
    f = click.option(
        "--pods-per-node",
        type=click.IntRange(min=1, max=1_000_000),
        default=1,
        show_default=True,
        help="Services without a 'node:' are placed by name, this many to a node (node-l4, "
        "waypoint: intra-node calls cross one node proxy; memory counts node proxies per node).",
    )(f)
    return click.option(
        "--architecture",
        default="sidecar",
        show_default=True,
        help="Mesh architecture(s), comma-separated: sidecar, node-l4, waypoint, none; several "
        "are compared side by side (the first prices the main prediction). A service's own "
        "'architecture:' in the ECG wins.",
    )(f)
