"""Entry points that move data: stored profiles in and out, the bundled examples, traces into
a store, generated call graphs, sidecar configurations from users' files, reports."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshtax import safeio
from meshtax.errors import UsageError
from meshtax.model.profile import Profile
from meshtax.model.sidecar import Mode, SidecarConfig
from meshtax.store.sqlite import ProfileStore

if TYPE_CHECKING:
    from meshtax.predict.whatif import Derivation

__all__ = [
    "build_report",
    "derive_speedup_file",
    "import_profile",
    "import_traces",
    "write_document",
    "write_examples",
]


def import_profile(file: str, store: ProfileStore, name: str | None, replace: bool) -> Profile:
    """Store a profile exported with ``meshtax profiles export``."""
    doc = safeio.load_document(file, "a profile document", nonfinite=True)
    if isinstance(doc, dict) and name:
        doc["name"] = name
    p = Profile.from_dict(doc, source=file)
    store.save(p, replace=replace)
    return p


def write_examples(dest: str) -> list[str]:
    """Copy the bundled example ECGs to ``dest`` and the speedup file to ``dest/whatif/`` (so
    ``predict DEST/*.yaml`` reads call graphs only); returns the paths written, relative."""
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
    return names


def import_traces(
    files: Sequence[str],
    out_dir: str,
    fmt: str | None,
    sidecar_mode: str,
    request_bytes: float,
    response_bytes: float,
    rate: float | None,
    overwrite: bool,
    progress: bool,
) -> str:
    """Stream traces into a store (bounded memory); returns the import report's summary."""
    from meshtax.traces import AlibabaOptions, SpanOptions, TraceFormatError, detect_format, ingest

    sidecar = SidecarConfig(Mode(sidecar_mode))
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
        _, rep = ingest(list(files), out_dir, f, options, overwrite=overwrite, progress=progress)
    except (TraceFormatError, OSError, FileExistsError) as e:
        raise UsageError(str(e)) from None
    summary: str = rep.summary()
    return summary


def build_report(
    files: Sequence[str],
    profiles: Sequence[str],
    store: ProfileStore,
    out: str,
    compare: tuple[str, str] | None = None,
    docs: Sequence[dict[str, Any]] = (),
) -> Path:
    """One self-contained HTML report from result files (or documents already in memory) and
    stored profiles; the store is read here, the renderers never see it."""
    from meshtax.report.build import report_from_files

    if not files and not profiles and not compare and not docs:
        raise UsageError("nothing to report: give result files, --profiles NAME or --compare A B")
    cmp_docs = (
        (store.get(compare[0]).to_dict(), store.get(compare[1]).to_dict()) if compare else None
    )
    try:
        return report_from_files(
            files,
            [store.get(n).to_dict() for n in profiles],
            out_path=out,
            compare=cmp_docs,
            docs=list(docs),
        )
    except ValueError as e:
        raise UsageError(str(e)) from None


def write_document(doc: Any, path: str, store: ProfileStore, profiles: Sequence[str] = ()) -> Path:
    """A result document as JSON, or as an HTML report when ``path`` ends in ``.html``."""
    out = Path(path)
    if out.suffix == ".html":
        docs = doc if isinstance(doc, list) else [doc]
        return build_report((), profiles, store, str(out), docs=docs)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, default=float))
    return out


def derive_speedup_file(
    store: ProfileStore,
    base: str,
    variant: str,
    output: str,
    sizes: Sequence[float] = (100.0, 4096.0),
    rate: float | None = None,
    name: str | None = None,
    every_mode: bool = False,
) -> Derivation:
    """Compare stored profiles BASE and VARIANT component by component and write the speedup
    file ``predict --speedup`` takes; returns the comparison."""
    import yaml

    from meshtax.predict.whatif import derive_speedup

    d = derive_speedup(store.get(base), store.get(variant), sizes or (100.0, 4096.0), rate)
    doc = d.document(name=name, every_mode=every_mode)
    Path(output).write_text(yaml.safe_dump(doc, sort_keys=False))
    return d
