"""Commands that measure this machine (root): profile, validate (doctor: :mod:`~meshtax.cli.doctor`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from meshtax.app import UsageError
from meshtax.app import data as app_data
from meshtax.cli._common import (
    NONNEG,
    POSITIVE,
    accept_unclosed_option,
    csv,
    db_option,
    main,
    parse_modes,
    report_option,
    speed_option,
    stderr,
    user_errors,
)
from meshtax.model.proxy import IPCS, TRAITS, WRITES
from meshtax.model.sidecar import Architecture
from meshtax.report.text import profile_text
from meshtax.store.sqlite import ProfileStore

_RESOLVE = "Probe until every component ≥ 2.5 µs is known within ±5 %, ≤ SECONDS a size."


@main.command()
@click.argument("topology", required=False)
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
    help="Requests/s of every run (0: closed loop; default 200, with --suite the suite's).",
)
@click.option(
    "--duration", type=POSITIVE, help="Seconds per run (default 3, with --suite the suite's)."
)
@click.option(
    "--profile",
    "profile",
    help="Profile to predict with (default: this machine's newest measured profile; with "
    "--suite: a new quick profile).",
)
@click.option(
    "--sweep",
    type=click.Choice(["size", "rate"]),
    help="Instead: one hop, message size 100 B → 64 KB or rate 25 → 100 %% of the no-mesh maximum.",
)
@click.option(
    "--suite",
    "suite",
    is_flag=False,
    flag_value="bundled",
    help="Instead: a quick profile, then every case of a validation suite (FILE, or the bundled "
    "app/suite.yaml when no FILE follows) into --out, calibration and hold-out sets apart.",
)
@click.option(
    "--out",
    "out",
    type=click.Path(file_okay=False),
    help="With --suite: the output directory (one JSON per case as it is done, the summary).",
)
@click.option("--resume", is_flag=True, help="With --suite: continue the run in --out.")
@click.option(
    "--sets",
    default="calibration,holdout",
    show_default=True,
    help="With --suite: the sets to measure.",
)
@click.option(
    "--order",
    type=click.Choice(["interleaved", "sets"]),
    default="interleaved",
    show_default=True,
    help="With --suite: the sets' cases spread evenly over the sitting, or set after set.",
)
@click.option("--name", help="With --suite: the new profile's name (default: generated).")
@click.option(
    "--levels",
    help="Tail latency under load: load levels as % of the no-mesh maximum (e.g. 25,50,75,90; "
    "the default of --sweep rate); with a topology, its first --query at each level.",
)
@click.option(
    "--connections",
    type=click.IntRange(1, 4096),
    default=32,
    show_default=True,
    help="With --levels or --sweep rate: concurrent clients.",
)
@click.option("--quick", is_flag=True, help="Shorter runs and fewer pairs (smoke runs, CI).")
@click.option(
    "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True
)
@click.option(
    "--architecture",
    type=click.Choice(["sidecar", "node-l4", "waypoint"]),
    default="sidecar",
    show_default=True,
    help="The mesh copy's architecture: Envoy sidecars, or Envoy per-node L4 proxies (mTLS "
    "between nodes) without or with a waypoint per service; node-l4 and waypoint place both "
    "copies' pods on nodes and price those crossings from this machine's newest profiles of "
    "the role (`meshtax profile --architecture`).",
)
@click.option(
    "--pods-per-node",
    type=click.IntRange(1, 1000),
    default=1,
    show_default=True,
    help="With --architecture node-l4|waypoint: services to a node, in the order calls reach them.",
)
@report_option
@db_option
@accept_unclosed_option
@speed_option(
    None,
    "Default: now with --suite (each case at the speed read beside it: suite run 9, "
    "BENCHMARKS.md), profile otherwise.",
)
@user_errors
def validate(
    topology: str | None,
    queries: tuple[str, ...],
    modes: str,
    rate: float | None,
    duration: float | None,
    profile: str | None,
    sweep: str | None,
    suite: str | None,
    out: str | None,
    resume: bool,
    sets: str,
    order: str,
    name: str | None,
    levels: str | None,
    connections: int,
    quick: bool,
    fmt: str,
    architecture: str,
    pods_per_node: int,
    report_path: str | None,
    db: str | None,
    accept_unclosed: bool,
    speed: str | None,
) -> None:
    """Deploy TOPOLOGY (bookinfo, online-boutique, hotel-reservation, social-network, media,
    search, order-pipeline, or a topology file) in pods without and with sidecars, measure
    end-to-end latency and CPU, predict from the app's own traces, and report measured vs
    predicted overhead (root). With --suite: a quick profile, then every case of a suite in
    the same sitting; the calibration and hold-out sets reported apart."""
    from meshtax.app import measure as m
    from meshtax.app.measure import ValidateOptions
    from meshtax.app.tail_validate import FRACTIONS, TailValidateOptions, validate_tail

    speed = speed or ("now" if suite is not None else "profile")
    if suite is not None:
        if topology or not out:
            raise UsageError("--suite takes no TOPOLOGY and needs --out DIR")
        suite_opts = m.SuiteOptions(
            out,
            None if suite == "bundled" else suite,
            csv(sets, str),
            rate,
            duration,
            quick,
            name,
            profile,
            accept_unclosed=accept_unclosed,
            speed=speed,
            resume=resume,
            order=order,
        )
        _suite(suite_opts, ProfileStore(db), fmt, report_path)
        return
    duration = 3.0 if duration is None else duration
    if topology is None and not sweep:
        raise UsageError("validate: give a TOPOLOGY (e.g. bookinfo), --sweep size|rate or --suite")
    mode_list = parse_modes(modes)
    tail_opts = None
    if sweep == "rate" or levels:
        try:
            fractions = csv(levels, lambda x: float(x) / 100) if levels else FRACTIONS
        except ValueError:
            raise UsageError(
                f"--levels {levels!r}: expected percentages like 25,50,75,90"
            ) from None
        tail_opts = TailValidateOptions(
            None if sweep == "rate" else topology,
            queries[0] if queries else None,
            mode_list[0],
            fractions,
            connections,
            min(duration, 1.0) if quick else duration,
            2 if quick else 3,
            profile,
            accept_unclosed,
        )
        tail_opts.plan()  # bad levels are refused before anything runs
    m.require_root("validation creates network namespaces and sidecars")
    store = ProfileStore(db)
    say = stderr
    if tail_opts is not None:
        tv = validate_tail(tail_opts, store, say)
        doc = tv.to_document()
        click.echo(json.dumps(doc, indent=2, default=str) if fmt == "json" else tv.table())
    elif sweep:
        sopts = m.SweepOptions(
            sweep,  # type: ignore[arg-type]
            mode_list[0],
            duration,
            profile,
            accept_unclosed=accept_unclosed,
        )
        doc = m.sweep(sopts, store, say).to_document()
        click.echo(json.dumps(doc, indent=2, default=str))
    else:
        assert topology is not None  # checked above
        try:
            opts = ValidateOptions(
                topology=topology,
                queries=queries,
                modes=mode_list,
                rate=200.0 if rate is None else rate,
                duration_s=duration,
                profile_name=profile,
                quick=quick,
                accept_unclosed=accept_unclosed,
                speed=speed,
                architecture=architecture,
                pods_per_node=pods_per_node,
            )
        except ValueError as e:
            raise UsageError(str(e)) from None
        res = m.validate(opts, store, say)
        doc = res.to_document()
        click.echo(json.dumps(doc, indent=2, default=str) if fmt == "json" else res.table())
    if report_path:
        click.echo(f"wrote {app_data.write_document(doc, report_path, store)}", err=True)


def _suite(opts: Any, store: ProfileStore, fmt: str, report_path: str | None) -> None:
    from meshtax.app import measure as m

    m.require_root("the suite profiles and creates network namespaces and sidecars")
    try:
        res = m.validate_suite(opts, store, stderr)
    except KeyboardInterrupt:
        click.echo(
            f"interrupted: the cases measured so far are in {opts.out} (summary.md); "
            "--resume continues",
            err=True,
        )
        sys.exit(130)
    doc = res.to_document()
    click.echo(json.dumps(doc, indent=2, default=str) if fmt == "json" else res.markdown())
    click.echo(f"wrote {opts.out}/summary.json and summary.md", err=True)
    if report_path:
        out = app_data.write_document(res.validation_documents(), report_path, store)
        click.echo(f"wrote {out}", err=True)


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
    help="Application protocols to measure through a tcp-mode sidecar "
    "(grpc,http; 'none': off; default: the preset's, grpc).",
)
@click.option(
    "--low-rates",
    "low_rates",
    help="Absolute low rates (requests/s) of extra CPU runs, e.g. 100,300 ('none': off; default: the preset's).",
)
@click.option(
    "--low-rate-repeats",
    "low_rate_repeats",
    type=click.IntRange(1, 9),
    help="Measure each low rate at or below 150/s as N differenced pairs of the preset's full "
    "length, keeping the median pair (default: the preset's — three with --quick, one otherwise; "
    "each pair is two more runs of that length).",
)
@click.option("--resolve", "resolve_s", type=POSITIVE, metavar="SECONDS", help=_RESOLVE)
@click.option(
    "--instances",
    type=click.IntRange(1, 16),
    help="Spread each size's probe windows over N sidecars, each started afresh (their "
    "share of the pairs and budget each; default 1): two sidecar instances differ beyond "
    "their windows' noise, N average them.",
)
@click.option(
    "--rounds",
    type=click.IntRange(1, 8),
    help="Take each mode's probe windows in N rounds spread over the whole run, each "
    "through a fresh sidecar (default 1): a mode's components then average the machine over "
    "the run, not over its own minutes.",
)
@click.option(
    "--round-beds",
    is_flag=True,
    default=None,
    help="With --rounds: build each early round's bed afresh (pods, echo app and sidecar), "
    "not only its sidecar (≈ 2 s a round).",
)
@click.option(
    "--capacity",
    is_flag=True,
    help="Also each mode's capacity: requests/s at saturation through the sidecar (many "
    "clients, closed loop, a ramp of fixed rates and its top rates twice more; ≈ 80 s per mode).",
)
@click.option(
    "--name",
    help="Profile name (default: <hostname>-<UTC time>; with --base, of the extended profile: "
    "default <base>+extras).",
)
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
    "--microarch",
    is_flag=True,
    help="Also count instructions, cache misses and branch mispredictions per request (base "
    "sidecar, each filter of --filters or a default set, their combinations; per mode and size).",
)
@click.option(
    "--counters",
    type=click.Choice(["auto", "valgrind", "pmu"]),
    default="auto",
    show_default=True,
    help="With --microarch: hardware counters (pmu), valgrind's simulators, or what this machine "
    "offers (see `meshtax doctor`).",
)
@click.option(
    "--symbol-map",
    type=click.Path(exists=True, dir_okay=False),
    help="With --microarch: `nm -C --defined-only` output of a stripped proxy binary, to split "
    "instructions into parsing, filters and other.",
)
@click.option(
    "--base",
    help="With --filters/--mtls/--memory/--large/--microarch: add to this stored profile "
    "(default: this machine's newest; measured first if none).",
)
@click.option(
    "--wait",
    "wait_s",
    type=NONNEG,
    default=0.0,
    show_default=True,
    help="Seconds to wait for another profiling run to finish (0: fail at once).",
)
@click.option(
    "--proxy",
    type=click.Choice(list(TRAITS)),
    default="envoy",
    show_default=True,
    help="The sidecar to profile: "
    + "; ".join(f"{k}: {t.what} ({', '.join(m.value for m in t.modes)})" for k, t in TRAITS.items())
    + ".",
)
@click.option(
    "--ipc",
    type=click.Choice(IPCS),
    default="tcp",
    show_default=True,
    help="The app↔sidecar legs: loopback TCP, Unix domain sockets, or loopback TCP redirected "
    "socket to socket by sockmap/sk_msg (bpf/sockredir).",
)
@click.option(
    "--write",
    type=click.Choice(WRITES),
    default="copy",
    show_default=True,
    help="The sidecar's sends: copied, or MSG_ZEROCOPY (refsidecar only).",
)
@click.option(
    "--zerocopy-min",
    type=click.IntRange(0, 1 << 30),
    default=0,
    show_default=True,
    help="With --write zerocopy: smaller sends are copied (0: every send is zero-copy).",
)
@click.option(
    "--architecture",
    type=click.Choice(["sidecar", "node-l4", "waypoint"]),
    default="sidecar",
    show_default=True,
    help="The proxy's role: a sidecar, a per-node L4 proxy (Envoy, mTLS between two node "
    "namespaces) or a waypoint (Envoy, L7, on node-l4); the last two on the node bed.",
)
@click.option(
    "--proxy-binary",
    type=click.Path(exists=True, dir_okay=False),
    help="Profile a proxy you bring (implies --proxy custom): its program, run as uid 1337 in "
    "the foreground (docs/architectures.md).",
)
@click.option(
    "--proxy-config",
    type=click.Path(exists=True, dir_okay=False),
    help="With --proxy-binary: its config template (${inbound_port}, ${outbound_port}, "
    "${app_host}, ${app_port}, ${mode}, ${workdir} are filled in).",
)
@click.option(
    "--proxy-args",
    default="",
    help="With --proxy-binary: its command line, a template of ${binary}, ${config}, "
    "${workdir} (default: '${binary} -c ${config}').",
)
@click.option(
    "--proxy-name",
    default="",
    help="With --proxy-binary: what the profile calls it (platform proxy 'custom:NAME').",
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
    low_rate_repeats: int | None,
    resolve_s: float | None,
    instances: int | None,
    rounds: int | None,
    round_beds: bool | None,
    capacity: bool,
    name: str | None,
    replace: bool,
    filters: str | None,
    mtls: bool,
    memory: bool,
    large: bool,
    microarch: bool,
    counters: str,
    symbol_map: str | None,
    base: str | None,
    wait_s: float,
    proxy: str,
    ipc: str,
    write: str,
    zerocopy_min: int,
    architecture: str,
    proxy_binary: str | None,
    proxy_config: str | None,
    proxy_args: str,
    proxy_name: str,
    db: str | None,
) -> None:
    """Measure a real sidecar (Envoy by default) on this machine (root) and store its profile.

    Pods in network namespaces with Istio-style interception, fortio load, eBPF probes and
    perf; everything is removed on exit, on Ctrl-C, and on the next start after a crash.
    With --filters/--mtls/--memory/--large/--microarch the extras are measured and stored as
    '<base>+extras' (the base profile is not changed).
    """
    from rich.progress import (
        BarColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from meshtax.app import measure as m
    from meshtax.app.measure import ExtrasOptions, ProfileOptions, ProxyChoice

    m.require_root("profiling creates network namespaces and attaches eBPF probes")
    try:
        own: tuple[str, ...] = ()
        if proxy_binary or proxy_config or proxy == "custom":
            if proxy not in ("envoy", "custom") or not (proxy_binary and proxy_config):
                raise ValueError("a proxy you bring: --proxy-binary and --proxy-config, both")
            proxy = "custom"
            template = Path(proxy_config).read_text()
            own = (str(Path(proxy_binary).resolve()), template, proxy_args, proxy_name)
        choice = ProxyChoice(proxy, ipc, write, zerocopy_min, *own)
        choice.check_modes(parse_modes(modes) if modes else ())
    except ValueError as e:
        raise UsageError(f"--proxy/--proxy-binary/--ipc/--write/--modes: {e}") from None
    try:
        popts = ProfileOptions(
            name=name,
            quick=quick,
            modes=parse_modes(modes) if modes else None,
            sizes=tuple(int(x) for x in sizes.split(",")) if sizes else None,
            duration_s=duration,
            replace=replace,
            carried=None if carried is None else csv(carried, str),
            low_rates=None if low_rates is None else csv(low_rates, float),
            capacity=True if capacity else None,
            low_rate_repeats=low_rate_repeats,
            resolve_s=resolve_s,
            instances=instances,
            rounds=rounds,
            round_beds=round_beds,
            proxy=choice,
            architecture=Architecture(architecture),
        )
        popts.resolve_plan()
    except ValueError as e:
        raise UsageError(
            f"--modes/--sizes/--carried/--low-rates: {e}; expected e.g. --modes tcp,http,grpc "
            "--sizes 100,1024 --carried grpc --low-rates 100,300"
        ) from None
    extras = None
    if filters or mtls or memory or large or microarch:
        which = None if not filters else "all" if filters == "all" else csv(filters, str)
        extras = ExtrasOptions(
            which,
            quick,
            mtls,
            memory,
            large,
            modes=popts.modes,
            name=name if base else None,  # with --base nothing else is named
            microarch=microarch,
            counters=counters,
            symbol_map=symbol_map,
        )
    store = ProfileStore(db)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task("starting", total=None)

        def progress(p: Any) -> None:
            bar.update(task, description=p.description, completed=p.index, total=p.total)

        done = m.measure(
            m.MeasureOptions(popts, extras, base, wait_s),
            store,
            progress,
            lambda msg: bar.update(task, description=msg),
        )
    click.echo(profile_text(done.profile), nl=False)
    for w in done.warnings:
        click.echo(f"WARNING: {w}", err=True)
    pl = done.profile.platform
    plain = pl.proxy == "envoy" and not pl.variant
    click.echo(
        f"stored profile {done.profile.name!r} in {store.path}; "
        + (
            f"`meshtax predict --architecture {pl.architecture}` prices that role with it"
            if pl.architecture
            else "`meshtax predict` uses it by default on this machine"
            if plain
            else "a proxy variant: name it (`--profile`, `meshtax whatif derive`) to use it"
        )
    )
