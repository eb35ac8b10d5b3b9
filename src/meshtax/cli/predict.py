"""Commands that predict and move data: predict, study, example, traces, config,
report."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import click

from meshtax.app import UsageError
from meshtax.app import data as app_data
from meshtax.app.predict import PredictOptions, StudyOptions, predict_files
from meshtax.cli._common import (
    NONNEG,
    POSITIVE,
    Number,
    accept_unclosed_option,
    architecture_options,
    db_option,
    emit,
    emit_with,
    format_option,
    main,
    output_option,
    report_option,
    speed_option,
    user_errors,
)
from meshtax.cli._tail import export, tail_options, tail_request
from meshtax.store.sqlite import ProfileStore


@main.command()
@click.argument("ecg_files", nargs=-1, required=True, type=click.Path())
@click.option(
    "--profile",
    "profile",
    help="Profile name (default: the newest measured profile of this machine). "
    "'reference' is the bundled published profile.",
)
@click.option(
    "--speedup", type=click.Path(), help="What-if speedup YAML: report before/after and the saving."
)
@click.option("--rate", type=POSITIVE, help="Override every invocation's rate (requests/s).")
@click.option(
    "--traces",
    is_flag=True,
    help="The files are distributed traces (Jaeger, OTLP, Zipkin, Alibaba CSV), not ECG files: "
    "files, directories, globs or - (stdin), gzip or zstd.",
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
@architecture_options
@db_option
@format_option
@output_option
@report_option
@accept_unclosed_option
@speed_option("profile")
@tail_options
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
    architecture: str,
    pods_per_node: int,
    node_profile: str | None,
    waypoint_profile: str | None,
    db: str | None,
    fmt: str,
    output: str | None,
    report_path: str | None,
    accept_unclosed: bool,
    speed: str,
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
        accept_unclosed=accept_unclosed,
        speed=speed,
        allow_outside=allow_outside,
        architectures=() if architecture == "sidecar" else tuple(architecture.split(",")),
        pods_per_node=pods_per_node,
        node_profile=node_profile,
        waypoint_profile=waypoint_profile,
        tail=tail_request(click.get_current_context()),
    )
    store = ProfileStore(db)
    doc = predict_files(opts, store, progress=_progress())
    # the renderers imported once predicted: the traces' workers start before them
    from meshtax.report.architectures import architectures_csv, architectures_text
    from meshtax.report.tail import tail_text
    from meshtax.report.text import prediction_text

    arch = doc.get("architectures")
    if arch is not None and fmt in ("table", "csv"):
        # the comparison: side by side (table) or one row per architecture and graph (csv)
        text = prediction_text(doc) + "\n" + architectures_text(arch)
        emit(text if fmt == "table" else architectures_csv(arch), output)
    elif fmt == "table":
        emit(prediction_text(doc) + tail_text(doc), output)
    else:
        emit_with(lambda out: export(fmt, doc, out), output)
    if report_path:
        out = app_data.build_report((), [doc["profile"]["name"]], store, report_path, docs=[doc])
        click.echo(f"wrote {out}", err=True)


def _progress(every_s: float = 2.0) -> Callable[[int], None]:
    """Graphs predicted so far, on stderr, every ``every_s`` once a prediction runs that long."""
    t0 = time.monotonic()
    last = t0

    def say(graphs: int) -> None:
        nonlocal last
        now = time.monotonic()
        if now - last >= every_s:
            last = now
            click.echo(f"predicted {graphs} graphs so far ({now - t0:.0f} s)", err=True)

    return say


@main.group()
def whatif() -> None:
    """What-if speedups measured from profiles instead of guessed."""


@whatif.command("derive")
@click.argument("base")
@click.argument("variant")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False))
@click.option(
    "--size",
    "sizes",
    type=NONNEG,
    multiple=True,
    help="Message size in bytes to compare at (repeatable; default 100 and 4096). "
    "The file's factors are those at the first.",
)
@click.option("--rate", type=POSITIVE, help="Requests/s for CPU (default: each model's highest).")
@click.option("--name", help="The speedup's name (default: VARIANT-vs-BASE).")
@click.option(
    "--every-mode", is_flag=True, help="Apply a one-mode comparison to every mode (under scale)."
)
@db_option
@user_errors
def whatif_derive(
    base: str,
    variant: str,
    output: str,
    sizes: tuple[float, ...],
    rate: float | None,
    name: str | None,
    every_mode: bool,
    db: str | None,
) -> None:
    """Compare stored profiles BASE and VARIANT component by component; write a speedup file."""
    d = app_data.derive_speedup_file(
        ProfileStore(db), base, variant, output, sizes, rate, name, every_mode
    )
    click.echo(f"{variant} / {base} ({d.platform}); 95 % intervals")
    for r in d.ratios:
        iv = "" if r.lo is None or r.hi is None else f" [{r.lo:.3f}, {r.hi:.3f}]"
        ratio = "-" if r.ratio is None else f"{r.ratio:.3f}{iv}"
        click.echo(
            f"  {r.mode.value:4} {r.component.key:24} {r.metric:7} {r.size:>7g} B  "
            f"{r.base:10.4g} → {r.variant:10.4g}  ×{ratio}"
        )
    for n in d.notes:
        click.echo(f"  note: {n}")
    click.echo(f"wrote {output} (factors at {d.sizes[0]:g} B)", err=True)


@main.command()
@click.option(
    "--dest", type=click.Path(file_okay=False), default="meshtax-examples", show_default=True
)
@user_errors
def example(dest: str) -> None:
    """Write the bundled example ECGs (Bookinfo, Online Boutique, Hotel Reservation) and a speedup file to DEST."""
    names = app_data.write_examples(dest)
    click.echo(f"wrote {len(names)} files to {dest}/: " + ", ".join(names))


@main.group()
def traces() -> None:
    """Import distributed traces into a partitioned store; generate Alibaba-like call graphs."""


@traces.command("import")
@click.argument("files", nargs=-1, required=True, type=click.Path())
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
    """Stream traces (files, directories, globs, - for stdin; gzip or zstd) into a store
    (bounded memory); prints what was kept and dropped, and why."""
    summary = app_data.import_traces(
        files,
        out_dir,
        fmt,
        sidecar_mode,
        request_bytes,
        response_bytes,
        rate,
        overwrite,
        progress=sys.stderr.isatty(),
    )
    click.echo(summary)
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
    type=Number(0.0, hi=1.0),
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
        f"wrote {summ.graphs} graphs, {summ.calls} calls, {summ.rows} rows ({summ.version}, seed "
        f"{summ.seed}) to {summ.path}"
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
    help="A configuration to study (repeatable), e.g. http=http, lua=http+lua or "
    "tls=tcp+mtls1.2. Default: the paper's five.",
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
@accept_unclosed_option
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
    accept_unclosed: bool,
) -> None:
    """Predict latency and CPU overhead of every call graph of an ingested STORE_DIR under
    several configurations."""
    from meshtax.app.predict import study as run_study

    store = ProfileStore(db)
    opts = StudyOptions(
        store_dir,
        out_dir,
        profile,
        configs,
        speedup,
        engine,
        scheduler,
        sys.stderr.isatty(),
        accept_unclosed,
    )
    summary, prof, warns = run_study(opts, store)
    for w in warns:
        click.echo(f"warning: {w}", err=True)
    click.echo(json.dumps(summary, indent=2, default=str))
    if report_path:
        files = [str(Path(out_dir) / "summary.json")]
        click.echo(
            f"wrote {app_data.build_report(files, [prof.name], store, report_path)}", err=True
        )


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
@click.option(
    "--injection",
    type=click.Choice(["labels", "enabled", "disabled"]),
    default="labels",
    show_default=True,
    help="Sidecar injection: as the manifests' labels say, or as if every namespace were "
    "labelled istio-injection=enabled (pods may still opt out), or none.",
)
@user_errors
def config_from_k8s(directory: str, ecg: bool, injection: str) -> None:
    """Each service's sidecar configuration from Kubernetes/Istio manifests in DIRECTORY, and what was assumed."""
    from meshtax.traces.envoy_config import ConfigImportError
    from meshtax.traces.k8s import sidecars_from_k8s

    try:
        imp = sidecars_from_k8s(directory, injection=injection)
    except ConfigImportError as e:
        raise UsageError(str(e)) from None
    click.echo(imp.to_ecg_services_yaml() if ecg else imp.report())


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
    from meshtax.report.build import open_in_browser

    path = app_data.build_report(files, profile_names, ProfileStore(db), output, compare)
    click.echo(f"wrote {path}")
    if open_ and not open_in_browser(path):
        click.echo("could not open a browser; open the file yourself", err=True)
