"""Library entry points behind the CLI: options in, result documents out (no argv, no printing)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from meshtax.host import this_host
from meshtax.model.ecg import ECG, ECGError, to_batch
from meshtax.model.profile import Profile
from meshtax.predict.engine import predict_batch
from meshtax.predict.whatif import SpeedupError, apply_speedup, speedup_from_dict
from meshtax.report.result import prediction_document
from meshtax.store.sqlite import ProfileStore, StoreError
from meshtax.traces.ecg_file import load_ecg_file


class UsageError(RuntimeError):
    """A problem the user can fix (bad input, missing profile); printed without a traceback."""


@dataclass(frozen=True)
class PredictOptions:
    ecg_files: tuple[str, ...]
    profile: str | None = None  # None: the newest measured profile of this host
    speedup: str | None = None
    rate: float | None = None  # override every invocation's rate (requests/s)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def choose_profile(store: ProfileStore, name: str | None) -> tuple[Profile, list[str]]:
    """The named profile, or this host's newest measured one. Warns when the platform differs."""
    host = this_host()
    if name is None:
        p = store.for_host(host)
        if p is None:
            raise UsageError(
                "no profile of this machine yet. Measure one with `meshtax profile --quick` (as root), "
                "or name one explicitly, e.g. `--profile reference` (published data of another platform)."
            )
        return p, []
    p = store.get(name)
    warnings = []
    if not p.platform.same_host(host):
        warnings.append(
            f"profile {p.name!r} was {'published' if p.provenance.source == 'published' else 'measured'} on a different platform "
            f"({p.platform.describe()}), not this machine ({host.describe()}); predictions describe that platform"
        )
    return p, warnings


def load_ecgs(files: Sequence[str]) -> list[ECG]:
    ecgs: list[ECG] = []
    for f in files:
        ecgs += load_ecg_file(f)
    if not ecgs:
        raise UsageError("no call graphs given")
    return ecgs


def load_speedup_file(path: str) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise SpeedupError(f"{path}: file not found") from None
    except yaml.YAMLError as e:
        raise SpeedupError(f"{path}: YAML syntax error: {e}") from None
    return doc if isinstance(doc, dict) else {"_": doc}


def predict_files(opts: PredictOptions, store: ProfileStore) -> dict[str, Any]:
    """Predict every graph of the ECG files; returns the result document."""
    ecgs = load_ecgs(opts.ecg_files)
    if opts.rate is not None:
        from dataclasses import replace

        ecgs = [replace(e, invocations=tuple(replace(i, rate=opts.rate) for i in e.invocations)) for e in ecgs]
    profile, warnings = choose_profile(store, opts.profile)

    def lookup(name: str | None) -> Profile:
        return profile if name is None or name == profile.name else store.get(name)

    batch = to_batch(ecgs)
    bp = predict_batch(batch, lookup)
    whatif = None
    if opts.speedup:
        sp = speedup_from_dict(load_speedup_file(opts.speedup), opts.speedup)
        after_profile, sw = apply_speedup(profile, sp, store.get)
        warnings += sw

        def lookup_after(name: str | None) -> Profile:
            return after_profile if name is None or name == profile.name else store.get(name)

        whatif = (sp.describe(), predict_batch(batch, lookup_after), after_profile)
    return prediction_document(batch, bp, profile, host=this_host(), options=opts.to_dict(), warnings=warnings, whatif=whatif)


__all__ = ["PredictOptions", "UsageError", "predict_files", "choose_profile", "ECGError", "StoreError", "SpeedupError"]
