"""The `meshtax` command: argv → frozen options → library calls → printed results.

Nothing below this module parses argv or prints. User errors (:class:`MeshtaxError`) print
one clear message and exit 2; anything else is a bug and prints one line and exits 70
(``--debug`` or ``$MESHTAX_DEBUG=1`` shows the traceback instead). Neither shows a traceback.
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import sys
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import click

from meshtax import safeio
from meshtax._version import __version__
from meshtax.app import PredictOptions, predict_files
from meshtax.errors import EXIT_INTERNAL, EXIT_USER, MeshtaxError, UsageError
from meshtax.host import this_host
from meshtax.model.profile import Profile
from meshtax.model.sidecar import Mode, SidecarConfig
from meshtax.report.exporters import EXPORTERS
from meshtax.report.text import prediction_text, profile_text, profiles_text
from meshtax.store.sqlite import ProfileStore

F = TypeVar("F", bound=Callable[..., Any])
USER_ERRORS: tuple[type[Exception], ...] = (MeshtaxError,)
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


class _Main(click.Group):
    """The command group with the last-resort handler: an unexpected exception is a bug;
    say so in one line and exit 70, unless --debug asks for the traceback."""

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


class _Number(click.ParamType):  # type: ignore[type-arg]
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
POSITIVE = _Number(0.0, open_lo=True, hi=1e9)  # rates, seconds, MB
NONNEG = _Number(0.0, hi=1e12)  # sizes in bytes, seconds to wait


def _emit(text: str, output: str | None) -> None:
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
        safeio.set_limits(
            safeio.Limits(
                max_bytes=int(max_input_mb * (1 << 20)),
                min_decompressed=max(
                    safeio.Limits().min_decompressed, int(max_input_mb * (1 << 20))
                ),
            )
        )


@main.command()
@click.argument("ecg_files", nargs=-1, required=True, type=click.Path())
@click.option(
    "--profile",
    "profile",
    help="Profile name (default: the newest measured profile of this machine). 'reference' is the bundled published profile.",
)
@click.option(
    "--speedup", type=click.Path(), help="What-if speedup YAML: report before/after and the saving."
)
@click.option("--rate", type=POSITIVE, help="Override every invocation's rate (requests/s).")
@click.option(
    "--traces",
    is_flag=True,
    help="The files are distributed traces (Jaeger, OTLP, Zipkin, Alibaba CSV), not ECG files.",
)
@click.option(
    "--trace-format",
    type=click.Choice(["jaeger", "otlp", "otlp-proto", "zipkin", "alibaba-v2021", "alibaba-v2022"]),
    help="With --traces: the format (default: detected from the first file).",
)
@click.option(
    "--sidecar",
    "sidecar_mode",
    type=click.Choice(["tcp", "http", "grpc"]),
    default="http",
    show_default=True,
    help="With --traces: the sidecar mode of every traced service.",
)
@click.option(
    "--service-map",
    type=click.Path(exists=True, dir_okay=False),
    help="With --traces: trace → Kubernetes service names (YAML/JSON).",
)
@click.option(
    "--allow-outside",
    multiple=True,
    type=click.Path(file_okay=False),
    help="Let ECG files read Envoy configs / manifests under this directory too (repeatable; "
    "by default only under the ECG file's own directory).",
)
@click.option(
    "--pod-cpus",
    type=click.IntRange(min=1, max=1_000_000),
    help="The pods share this many CPUs: latency overhead is at least the request's sidecar CPU work ÷ N "
    "(default: every pod has CPUs of its own, the critical path alone).",
)
@db_option
@format_option
@output_option
@report_option
@user_errors
def predict(
    ecg_files: tuple[str, ...],
    profile: str | None,
    speedup: str | None,
    rate: float | None,
    traces: bool,
    trace_format: str | None,
    sidecar_mode: str,
    service_map: str | None,
    allow_outside: tuple[str, ...],
    pod_cpus: int | None,
    db: str | None,
    fmt: str,
    output: str | None,
    report_path: str | None,
) -> None:
    """Predict latency and CPU overhead of sidecars on ECG_FILES (YAML/JSON call graphs).

    Several graphs of one API (files, or a file with 'graphs:') give a distribution.
    """
    opts = PredictOptions(
        ecg_files=ecg_files,
        profile=profile,
        speedup=speedup,
        rate=rate,
        trace_format=(trace_format or "auto") if traces or trace_format else None,
        sidecar_mode=sidecar_mode,
        service_map=service_map,
        pod_cpus=pod_cpus,
        allow_outside=allow_outside,
    )
    store = ProfileStore(db)
    doc = predict_files(opts, store)
    _emit(prediction_text(doc) if fmt == "table" else EXPORTERS[fmt].export(doc), output)
    if report_path:
        from meshtax.report.build import build_report

        click.echo(
            f"wrote {build_report([doc], [store.get(doc['profile']['name']).to_dict()], out_path=report_path)}",
            err=True,
        )


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
@user_errors
def profiles_show(name: str, db: str | None, fmt: str, size: float, rate: float) -> None:
    """The component breakdown of profile NAME (the paper's Table 2 layout)."""
    p = ProfileStore(db).get(name)
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
    _emit(EXPORTERS[fmt].export(ProfileStore(db).get(name).to_dict()), output)


@profiles.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--name", help="Store under this name instead of the document's.")
@click.option("--replace", is_flag=True, help="Replace a stored profile of the same name.")
@db_option
@user_errors
def profiles_import(file: str, name: str | None, replace: bool, db: str | None) -> None:
    """Import a profile exported with `meshtax profiles export`."""
    doc = safeio.load_document(file, "a profile document", nonfinite=True)
    if isinstance(doc, dict) and name:
        doc["name"] = name
    p = Profile.from_dict(doc, source=file)
    ProfileStore(db).save(p, replace=replace)
    click.echo(f"imported profile {p.name!r} ({p.provenance.source}, {p.platform.describe()})")


@profiles.command("delete")
@click.argument("name")
@db_option
@user_errors
def profiles_delete(name: str, db: str | None) -> None:
    """Delete stored profile NAME."""
    ProfileStore(db).delete(name)
    click.echo(f"deleted {name!r}")


@main.command()
@click.option(
    "--dest", type=click.Path(file_okay=False), default="meshtax-examples", show_default=True
)
@user_errors
def example(dest: str) -> None:
    """Write the bundled example ECGs (Bookinfo, Online Boutique, Hotel Reservation) to DEST
    and a speedup file to DEST/whatif/ (so `predict DEST/*.yaml` reads call graphs only)."""
    out = Path(dest)
    src = resources.files("meshtax").joinpath("data/examples")
    names = []
    for f in sorted(src.iterdir(), key=lambda t: t.name):
        if f.name.endswith(".yaml"):
            to = out / ("whatif" if f.name.startswith("speedup") else "") / f.name
            to.parent.mkdir(parents=True, exist_ok=True)
            with resources.as_file(f) as path:
                shutil.copyfile(path, to)
            names.append(str(to.relative_to(out)))
    click.echo(f"wrote {len(names)} files to {out}/: " + ", ".join(names))


@main.group()
def traces() -> None:
    """Import distributed traces into a partitioned store; generate Alibaba-like call graphs."""


@traces.command("import")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False),
    help="Store directory (partitioned Parquet).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["jaeger", "otlp", "otlp-proto", "zipkin", "alibaba-v2021", "alibaba-v2022"]),
    help="Input format (default: detected).",
)
@click.option(
    "--sidecar",
    "sidecar_mode",
    type=click.Choice(["tcp", "http", "grpc"]),
    default="http",
    show_default=True,
)
@click.option(
    "--request-bytes",
    type=NONNEG,
    default=100.0,
    show_default=True,
    help="Size when the traces give none (the paper's 100 B).",
)
@click.option("--response-bytes", type=NONNEG, default=100.0, show_default=True)
@click.option(
    "--rate",
    type=POSITIVE,
    help="Requests/s of every call (Alibaba default: the paper's 30 000; spans: counted).",
)
@click.option("--overwrite", is_flag=True)
@user_errors
def traces_import(
    files: tuple[str, ...],
    out_dir: str,
    fmt: str | None,
    sidecar_mode: str,
    request_bytes: float,
    response_bytes: float,
    rate: float | None,
    overwrite: bool,
) -> None:
    """Stream traces into a store (bounded memory); prints what was kept and dropped, and why."""
    from meshtax.traces import AlibabaOptions, SpanOptions, detect_format, ingest

    sidecar = SidecarConfig(Mode(sidecar_mode))
    for path in files:
        safeio.check_regular(path, "a trace file")
    try:
        f = fmt or detect_format(files[0])
        options: Any = (
            AlibabaOptions(
                request_bytes=request_bytes,
                response_bytes=response_bytes,
                sidecar=sidecar,
                **({"rate": rate} if rate else {}),
            )
            if f.startswith("alibaba")
            else SpanOptions(
                request_bytes=request_bytes,
                response_bytes=response_bytes,
                rate=rate,
                default_sidecar=sidecar,
            )
        )
        store, rep = ingest(
            list(files), out_dir, f, options, overwrite=overwrite, progress=sys.stderr.isatty()
        )
    except OSError as e:
        raise UsageError(str(e)) from None
    click.echo(rep.summary())
    click.echo(f"store: {out_dir}")


@traces.command("generate")
@click.option("--graphs", type=click.IntRange(min=1), required=True, help="Number of call graphs.")
@click.option(
    "--out",
    "out_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="CSV file (.gz compresses).",
)
@click.option(
    "--version",
    "version",
    type=click.Choice(["v2021", "v2022"]),
    default="v2021",
    show_default=True,
)
@click.option("--seed", type=int, default=1, show_default=True)
@click.option(
    "--broken-fraction",
    type=_Number(0.0, hi=1.0),
    default=0.0,
    show_default=True,
    help="Share of graphs with a missing inner call (as in real traces).",
)
@user_errors
def traces_generate(
    graphs: int, out_path: str, version: str, seed: int, broken_fraction: float
) -> None:
    """Alibaba-like call graphs (calibrated to the published statistics), in the v2021/v2022 CSV schema."""
    from rich.progress import Progress

    from meshtax.traces import generate

    with Progress(disable=not sys.stderr.isatty(), transient=True) as bar:
        task = bar.add_task("generating", total=graphs)
        summ = generate(
            graphs,
            seed,
            f"alibaba-{version}",
            out_path,
            broken_fraction=broken_fraction,
            progress=lambda done, total: bar.update(task, completed=done, total=total),
        )
    click.echo(
        f"wrote {summ.graphs} graphs, {summ.calls} calls, {summ.rows} rows ({summ.version}, seed {summ.seed}) to {summ.path}"
    )


@main.command()
@click.argument("store_dir", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False),
    help="Output directory (Parquet per graph, cdf.csv, summary.json).",
)
@click.option(
    "--profile", "profile", help="Profile name (default: this machine's newest measured profile)."
)
@click.option(
    "--config",
    "configs",
    multiple=True,
    metavar="NAME=MODE[+FILTER…][+mtls[1.2|1.3]]",
    help="A configuration to study (repeatable), e.g. http=http, lua=http+lua or tls=tcp+mtls1.2. Default: the paper's five.",
)
@click.option(
    "--speedup",
    type=click.Path(exists=True, dir_okay=False),
    help="What-if speedup YAML, compared across all graphs.",
)
@click.option("--engine", type=click.Choice(["local", "dask"]), default="local", show_default=True)
@click.option(
    "--scheduler",
    help="With --engine dask: a dask.distributed scheduler address (default: a local cluster).",
)
@report_option
@db_option
@user_errors
def study(
    store_dir: str,
    out_dir: str,
    profile: str | None,
    configs: tuple[str, ...],
    speedup: str | None,
    engine: str,
    scheduler: str | None,
    report_path: str | None,
    db: str | None,
) -> None:
    """Predict latency and CPU overhead of every call graph of an ingested STORE_DIR under several configurations."""
    from meshtax.app import choose_profile, load_speedup_file
    from meshtax.predict.study import StudyConfig, run_study
    from meshtax.predict.whatif import apply_speedup, speedup_from_dict

    store = ProfileStore(db)
    prof, warns = choose_profile(store, profile)
    for w in warns:
        click.echo(f"warning: {w}", err=True)
    cfgs = [_study_config(c) for c in configs] or None
    after = None
    if speedup:
        sp = speedup_from_dict(load_speedup_file(speedup), speedup)
        after, sw = apply_speedup(prof, sp, store.get)
        for w in sw:
            click.echo(f"warning: {w}", err=True)
    summ = run_study(
        store_dir,
        [StudyConfig(n, c) for n, c in cfgs] if cfgs else None,
        prof,
        out_dir,
        engine=engine,  # type: ignore[arg-type]
        scheduler=scheduler,
        speedup_profile=after,
        progress=sys.stderr.isatty(),
    )
    click.echo(json.dumps(summ.to_dict(), indent=2, default=str))
    if report_path:
        from meshtax.report.build import report_from_files

        click.echo(
            f"wrote {report_from_files([str(Path(out_dir) / 'summary.json')], [prof.to_dict()], out_path=report_path)}",
            err=True,
        )


def _study_config(text: str) -> tuple[str, SidecarConfig]:
    name, _, spec = text.partition("=")
    parts = [p.strip() for p in (spec or name).split("+") if p.strip()]
    try:
        mode = Mode(parts[0])
    except (ValueError, IndexError):
        raise UsageError(
            f"--config {text!r}: expected NAME=MODE[+FILTER…][+mtls[1.2|1.3]] with MODE tcp, http or grpc"
        ) from None
    rest = parts[1:]
    tls = [p for p in rest if p.startswith("mtls")]
    version = tls[-1][4:] or None if tls else None
    try:
        return name, SidecarConfig(
            mode, tuple(p for p in rest if not p.startswith("mtls")), bool(tls), tls_version=version
        )
    except ValueError as e:
        raise UsageError(f"--config {text!r}: {e} (write +mtls, +mtls1.2 or +mtls1.3)") from None


@main.group()
def config() -> None:
    """Read sidecar configurations as users write them (Envoy configs, Kubernetes/Istio manifests)."""


@config.command("from-envoy")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--listener", help="Model this listener (default: the inbound one, e.g. virtualInbound/15006)."
)
@click.option(
    "--port", type=int, help="Within the listener, the filter chain of this destination port."
)
@click.option(
    "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True
)
@user_errors
def config_from_envoy(file: str, listener: str | None, port: int | None, fmt: str) -> None:
    """The sidecar configuration meshtax models (mode, filter chain, TLS) of an Envoy config FILE."""
    from meshtax.traces.envoy_config import ConfigImportError, sidecar_from_envoy

    try:
        imp = sidecar_from_envoy(file, listener=listener, port=port)
    except ConfigImportError as e:
        raise UsageError(str(e)) from None
    if fmt == "json":
        click.echo(
            json.dumps(
                {
                    "sidecar": imp.config.to_dict(),
                    "unknown_filters": list(imp.unknown_filters),
                    "ignored": list(imp.ignored),
                    "notes": list(imp.notes),
                },
                indent=2,
            )
        )
    else:
        click.echo(imp.report())


@config.command("from-k8s")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--ecg", is_flag=True, help="Print an ECG 'services:' block to paste into a call graph."
)
@user_errors
def config_from_k8s(directory: str, ecg: bool) -> None:
    """Each service's sidecar configuration from Kubernetes/Istio manifests in DIRECTORY, and what was assumed."""
    from meshtax.traces.envoy_config import ConfigImportError
    from meshtax.traces.k8s import sidecars_from_k8s

    try:
        imp = sidecars_from_k8s(directory)
    except ConfigImportError as e:
        raise UsageError(str(e)) from None
    click.echo(imp.to_ecg_services_yaml() if ecg else imp.report())


@main.command()
@click.argument("topology")
@click.option(
    "--query",
    "queries",
    multiple=True,
    help="Query to validate (repeatable; default: every query of the topology).",
)
@click.option(
    "--modes", default="tcp,http,grpc", show_default=True, help="Comma-separated sidecar modes."
)
@click.option(
    "--rate",
    type=NONNEG,
    default=200.0,
    show_default=True,
    help="Requests/s of every run (0: closed loop).",
)
@click.option("--duration", type=POSITIVE, default=3.0, show_default=True, help="Seconds per run.")
@click.option(
    "--profile",
    "profile",
    help="Profile to predict with (default: this machine's newest measured profile).",
)
@click.option(
    "--sweep",
    type=click.Choice(["size", "rate"]),
    help="Instead: one hop, message size 100 B → 64 KB or rate 25 → 100 %% of the no-mesh maximum.",
)
@click.option("--quick", is_flag=True, help="Shorter runs and fewer pairs (smoke runs, CI).")
@click.option(
    "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True
)
@report_option
@db_option
@user_errors
def validate(
    topology: str,
    queries: tuple[str, ...],
    modes: str,
    rate: float,
    duration: float,
    profile: str | None,
    sweep: str | None,
    quick: bool,
    fmt: str,
    report_path: str | None,
    db: str | None,
) -> None:
    """Deploy TOPOLOGY (bookinfo, online-boutique, hotel-reservation, or a topology file) in pods
    without and with sidecars, measure end-to-end latency and CPU, predict from the app's own
    traces, and report measured vs predicted overhead (root)."""
    import os

    from meshtax.profile.system import RealSystem
    from meshtax.validate.run import ValidateOptions, run_sweep, run_validation

    if os.geteuid() != 0:
        raise UsageError("validation creates network namespaces and sidecars: run it as root")
    store = ProfileStore(db)
    try:
        mode_list = tuple(Mode(m.strip()) for m in modes.split(","))
    except ValueError as e:
        raise UsageError(f"--modes: {e}; expected e.g. tcp,http,grpc") from None

    def progress(msg: str) -> None:
        click.echo(msg, err=True)

    try:
        if sweep:
            sres = run_sweep(
                sweep,  # type: ignore[arg-type]
                RealSystem(),
                store,
                mode=mode_list[0],
                duration_s=duration,
                profile_name=profile,
                progress=progress,
            )
            doc = sres.to_document()
            click.echo(json.dumps(doc, indent=2, default=str))
            if report_path:
                from meshtax.validate.run import write_report

                write_report(doc, report_path)
            return
        opts = ValidateOptions(
            topology=topology,
            queries=queries,
            modes=mode_list,
            rate=rate,
            duration_s=duration,
            profile_name=profile,
            report_path=report_path,
            quick=quick,
        )
        res = run_validation(opts, RealSystem(), store, progress)
    except (ValueError, FileNotFoundError) as e:
        raise UsageError(str(e)) from None
    click.echo(
        json.dumps(res.to_document(), indent=2, default=str) if fmt == "json" else res.table()
    )


@main.command()
@click.option(
    "--profile",
    "profile",
    help="Profile to calibrate (default: this machine's newest measured profile).",
)
@click.option(
    "--modes",
    default="",
    help="Comma-separated sidecar modes of the chains (default: every mode of the profile).",
)
@click.option(
    "--rate", type=POSITIVE, default=100.0, show_default=True, help="Requests/s of every run."
)
@click.option("--duration", type=POSITIVE, default=3.0, show_default=True, help="Seconds per run.")
@click.option("--quick", is_flag=True, help="Fewer pairs (smoke runs, CI): a wide interval.")
@click.option(
    "--keep",
    "keep_dir",
    type=click.Path(file_okay=False),
    help="Keep the chains' validation documents and traces here (one directory per mode).",
)
@db_option
@user_errors
def calibrate(
    profile: str | None,
    modes: str,
    rate: float,
    duration: float,
    quick: bool,
    keep_dir: str | None,
    db: str | None,
) -> None:
    """Measure how warm a sidecar is among many on shared CPUs (root): per mode, chains of 1, 2,
    4 and 8 services without and with sidecars, then store the exponent α the engine prices
    shared CPUs with in the profile (replacing it; each mode is stored as soon as it is done)."""
    import os

    from meshtax.profile.system import RealSystem
    from meshtax.report.text import colocation_lines
    from meshtax.validate.colocation import calibrate as run_calibration
    from meshtax.validate.run import choose_profile

    if os.geteuid() != 0:
        raise UsageError("the calibration creates network namespaces and sidecars: run it as root")
    store = ProfileStore(db)
    try:
        prof = choose_profile(store, profile)
        mode_list = (
            tuple(Mode(m.strip()) for m in modes.split(",")) if modes.strip() else tuple(prof.modes)
        )
        for m in mode_list:
            keep = None if keep_dir is None else Path(keep_dir) / m.value
            prof, res = run_calibration(
                RealSystem(),
                store,
                profile_name=prof.name,
                mode=m,
                rate=rate,
                duration_s=duration,
                quick=quick,
                keep_dir=keep,
                progress=lambda msg: click.echo(msg, err=True),
            )
            click.echo(
                f"The {m.value}-mode chains, predicted before this calibration:\n" + res.table()
            )
    except ValueError as e:
        raise UsageError(str(e)) from None
    click.echo("\n".join(colocation_lines(prof.colocation)))
    click.echo(f"stored in profile {prof.name!r} of {store.path}")


V = TypeVar("V")


def _csv(text: str, conv: Callable[[str], V]) -> tuple[V, ...]:
    """``"a,b"`` → ``(conv("a"), conv("b"))``; ``"none"`` (or empty) → ``()``."""
    if text.strip().lower() in ("", "none"):
        return ()
    return tuple(conv(x.strip()) for x in text.split(","))


@main.command("profile")
@click.option(
    "--quick",
    is_flag=True,
    help="Quick preset (3 sizes, short runs; aim ≤ 3 min) instead of the full one (aim ≤ 20 min).",
)
@click.option("--modes", help="Comma-separated modes to profile (tcp,http,grpc).")
@click.option("--sizes", help="Comma-separated message sizes in bytes, e.g. 100,1024,4096.")
@click.option("--duration", type=POSITIVE, help="Base seconds per load run.")
@click.option(
    "--carried",
    help="Application protocols to measure through a tcp-mode sidecar (grpc,http; 'none': off; default: the preset's, grpc).",
)
@click.option(
    "--low-rates",
    "low_rates",
    help="Absolute low rates (requests/s) of extra CPU runs, e.g. 100,300 ('none': off; default: the preset's).",
)
@click.option("--name", help="Profile name (default: <hostname>-<UTC time>).")
@click.option("--replace", is_flag=True, help="Replace a stored profile of the same name.")
@click.option(
    "--filters",
    help="Also profile filters: 'all' or a comma-separated list (e.g. lua,wasm,rbac_http_1000).",
)
@click.option(
    "--mtls",
    is_flag=True,
    help="Also profile sidecar-to-sidecar mTLS (per-byte and per-connection handshake cost).",
)
@click.option(
    "--memory", is_flag=True, help="Also profile resident memory against open connections."
)
@click.option(
    "--large", is_flag=True, help="Also profile large messages (up to 1 MB) and where they split."
)
@click.option(
    "--base",
    help="With --filters/--mtls/--memory/--large: add to this stored profile (default: this machine's newest; measured first if none).",
)
@click.option(
    "--wait",
    "wait_s",
    type=NONNEG,
    default=0.0,
    show_default=True,
    help="Seconds to wait for another profiling run to finish (0: fail at once).",
)
@db_option
@user_errors
def profile_cmd(
    quick: bool,
    modes: str | None,
    sizes: str | None,
    duration: float | None,
    carried: str | None,
    low_rates: str | None,
    name: str | None,
    replace: bool,
    filters: str | None,
    mtls: bool,
    memory: bool,
    large: bool,
    base: str | None,
    wait_s: float,
    db: str | None,
) -> None:
    """Measure a real Envoy sidecar on this machine (root) and store its profile.

    Pods in network namespaces with Istio-style interception, fortio load, eBPF probes and
    perf; everything is removed on exit, on Ctrl-C, and on the next start after a crash.
    With --filters/--mtls/--memory/--large the extra components are measured and stored as
    '<base>+extras' (the base profile is not changed).
    """
    import os
    import warnings

    from rich.progress import (
        BarColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from meshtax.profile.run import Backends, ClosureWarning, ProfileOptions, run_profile
    from meshtax.profile.runstate import RunBusy
    from meshtax.profile.system import RealSystem

    if os.geteuid() != 0:
        raise UsageError(
            "profiling creates network namespaces and attaches eBPF probes: run it as root (see `meshtax doctor`)"
        )
    try:
        opts = ProfileOptions(
            name=name,
            quick=quick,
            modes=tuple(Mode(m.strip()) for m in modes.split(",")) if modes else None,
            sizes=tuple(int(x) for x in sizes.split(",")) if sizes else None,
            duration_s=duration,
            replace=replace,
            carried=None if carried is None else _csv(carried, str),
            low_rates=None if low_rates is None else _csv(low_rates, float),
        )
        opts.resolve_plan()  # refuse a bad combination before anything starts
    except ValueError as e:
        raise UsageError(
            f"--modes/--sizes/--carried/--low-rates: {e}; expected e.g. --modes tcp,http,grpc "
            "--sizes 100,1024 --carried grpc --low-rates 100,300"
        ) from None
    store = ProfileStore(db)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    with warnings.catch_warnings(record=True) as caught, Progress(*columns, transient=False) as bar:
        warnings.simplefilter("always", ClosureWarning)
        task = bar.add_task("starting", total=None)

        def progress(p: Any) -> None:
            bar.update(task, description=p.description, completed=p.index, total=p.total)

        extras = filters or mtls or memory or large
        host_profile = None if base or not extras else store.for_host(this_host())
        try:
            prof: Profile
            if extras and base:
                prof = store.get(base)
            elif extras and host_profile is not None:
                prof = host_profile
            else:
                prof = run_profile(
                    opts, RealSystem(), store, progress, backends=Backends(lock_timeout=wait_s)
                )
            if extras:
                from meshtax.profile.extras import ExtrasOptions, profile_extras

                xo = ExtrasOptions(
                    filters=None
                    if not filters
                    else (
                        "all" if filters == "all" else tuple(f.strip() for f in filters.split(","))
                    ),
                    quick=quick,
                    mtls=mtls,
                    memory=memory,
                    large=large,
                    modes=opts.modes,
                )
                prof = profile_extras(
                    xo,
                    RealSystem(),
                    store,
                    prof.name,
                    lambda msg: bar.update(task, description=msg),
                )
        except RunBusy as e:
            raise UsageError(str(e)) from None
        except ValueError as e:
            raise UsageError(str(e)) from None
    click.echo(profile_text(prof), nl=False)
    for w in caught:
        if issubclass(w.category, ClosureWarning):
            click.echo(f"WARNING: {w.message}", err=True)
    click.echo(
        f"stored profile {prof.name!r} in {store.path}; `meshtax predict` uses it by default on this machine"
    )


@main.command()
@click.argument("files", nargs=-1, type=click.Path())
@click.option(
    "--profiles", "profile_names", multiple=True, help="Include stored profile NAME (repeatable)."
)
@click.option("--compare", nargs=2, metavar="A B", help="Compare two stored profiles side by side.")
@click.option(
    "-o",
    "--output",
    default="meshtax-report.html",
    show_default=True,
    type=click.Path(dir_okay=False),
)
@click.option("--open", "open_", is_flag=True, help="Open the report in a browser.")
@db_option
@user_errors
def report(
    files: tuple[str, ...],
    profile_names: tuple[str, ...],
    compare: tuple[str, str] | None,
    output: str,
    open_: bool,
    db: str | None,
) -> None:
    """Build one self-contained HTML report from result FILES (prediction/study/validation JSON,
    study Parquet) and stored profiles."""
    from meshtax.report.build import open_in_browser, report_from_files

    store = ProfileStore(db)
    if not files and not profile_names and not compare:
        raise UsageError("nothing to report: give result files, --profiles NAME or --compare A B")
    try:
        path = report_from_files(
            files,
            [store.get(n).to_dict() for n in profile_names],
            out_path=output,
            compare=(store.get(compare[0]).to_dict(), store.get(compare[1]).to_dict())
            if compare
            else None,
        )
    except ValueError as e:
        raise UsageError(str(e)) from None
    click.echo(f"wrote {path}")
    if open_ and not open_in_browser(path):
        click.echo("could not open a browser; open the file yourself", err=True)


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
    """Check what profiling needs (root, tracefs, bpffs, BTF, memlock, netns, iptables, Envoy, fortio, perf, probe build)."""
    from meshtax.profile import doctor as doc
    from meshtax.profile.system import RealSystem

    system = RealSystem()
    if prepare:
        for change in doc.prepare(system):
            click.echo(f"prepared: {change}")
    checks = doc.check_all(system)
    if fmt == "json":
        click.echo(
            json.dumps(
                [{"name": c.name, "ok": c.ok, "detail": c.detail, "fix": c.fix} for c in checks],
                indent=2,
            )
        )
    else:
        for c in checks:
            click.echo(
                f"{'ok ' if c.ok else 'MISSING'} {c.name}: {c.detail}"
                + ("" if c.ok else f"\n        fix: {c.fix}")
            )
    if not all(c.ok for c in checks):
        sys.exit(1)


if __name__ == "__main__":
    main()
