"""The one profile resolver: which stored profile a command uses, and what it must say about
it. ``predict``, ``study``, ``validate`` and ``report`` all go through
:func:`resolve_profile`, so they share defaults and warnings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from meshtax.model.profile import Platform, Profile
from meshtax.model.speed import busy_host_note
from meshtax.store.sqlite import StoreError

__all__ = [
    "NoProfile",
    "ProfileSource",
    "Resolved",
    "UnclosedProfile",
    "quality_lines",
    "resolve_profile",
]


class ProfileSource(Protocol):
    """What the resolver needs of a store (``ProfileStore`` satisfies it)."""

    def get(self, name: str) -> Profile: ...

    def for_host(self, host: Platform) -> Profile | None: ...

    @property
    def unusable(self) -> Sequence[tuple[str, str]]:
        """Stored profiles that failed validation on load, with why."""
        ...


class NoProfile(StoreError):
    """No profile of this machine is stored, and none was named."""


class UnclosedProfile(StoreError):
    """The profile failed its closure check; refused unless the caller accepts it."""


def quality_lines(p: Profile) -> list[str]:
    """What a user must know about a profile before trusting numbers made with it: modes
    whose components do not add up to the measured overhead, and other work during it."""
    out = []
    for m, mp in p.modes.items():
        c = mp.closure
        if c is not None and not c.closes:
            out.append(
                f"profile {p.name!r}, {m.value} mode: components {c.components_us:.1f} µs vs "
                f"measured overhead {c.measured_us:.1f} µs per message ({c.error:+.0%}, "
                f"beyond ±{c.tolerance:.0%}): unclosed"
            )
    for (m, proto), c in p.carried_closures().items():
        if not c.closes:
            out.append(
                f"profile {p.name!r}, {m.value} mode carrying {proto}: latency components "
                f"{c.components_us:.1f} µs vs measured overhead {c.measured_us:.1f} µs per "
                f"message ({c.error:+.0%}, beyond ±{c.tolerance:.0%}); they price the latency "
                f"of {m.value}-mode sidecars in front of {proto} apps"
            )
    i = p.interference
    if i.get("rejected"):
        out.append(
            f"profile {p.name!r}: {i['rejected']} probe window pair(s) were disturbed by other "
            f"work and measured again (others' CPU share up to {i.get('others_median_max', 0):.0%})"
        )
    if i.get("forced"):
        out.append(
            f"profile {p.name!r}: {i['forced']} probe window pair(s) were kept although other "
            "work ran during them (no undisturbed pair of their size): its costs may be high"
        )
    busy = busy_host_note(i)
    if busy is not None:
        out.append(f"profile {p.name!r}: {busy}")
    if p.transfer is not None:
        out.append(f"profile {p.name!r}: {p.transfer.describe()}")
    return out


@dataclass(frozen=True)
class Resolved:
    """The profile to use, and the warnings every output that uses it must carry."""

    profile: Profile
    warnings: tuple[str, ...] = ()


def resolve_profile(
    store: ProfileSource, name: str | None, host: Platform, *, accept_unclosed: bool = False
) -> Resolved:
    """The named profile, or ``host``'s newest measured one. Warns when the platform differs
    (a published profile, or one measured on another machine, describes that machine) and
    about the profile's quality; refuses an unclosed profile unless ``accept_unclosed``."""
    if name is None:
        p = store.for_host(host)
        if p is None and store.unusable:
            names = ", ".join(repr(n) for n, _ in store.unusable)
            raise NoProfile(
                f"no usable profile of this machine: {names} failed validation "
                f"({store.unusable[0][1]}); measure again, or name one with --profile"
            )
        if p is None:
            raise NoProfile(
                "no profile of this machine yet. Measure one with `meshtax profile --quick` "
                "(as root), or name one explicitly, e.g. `--profile reference` (published data "
                "of another platform)."
            )
    else:
        p = store.get(name)
    quality = quality_lines(p)
    if p.unclosed and not accept_unclosed:
        raise UnclosedProfile(
            "; ".join(quality or [f"profile {p.name!r} is marked unclosed"])
            + ". Its components do not add up to the overhead it measured, so predictions made "
            "with it are not trustworthy: profile again on a quieter machine, or pass "
            "--accept-unclosed to use it anyway"
        )
    warnings = list(quality)
    if not p.platform.same_host(host):
        how = "published" if p.provenance.source == "published" else "measured"
        warnings.insert(
            0,
            f"profile {p.name!r} was {how} on a different platform ({p.platform.describe()}), "
            f"not this machine ({host.describe()}); predictions describe that platform",
        )
    return Resolved(p, tuple(warnings))
