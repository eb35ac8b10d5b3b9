"""The one profile resolver: which stored profile a command uses, and what it must say about
it. ``predict``, ``study``, ``validate``, ``calibrate`` and ``report`` all go through
:func:`resolve_profile`, so they share defaults and warnings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from meshtax.model.profile import Platform, Profile
from meshtax.store.sqlite import StoreError

__all__ = ["NoProfile", "ProfileSource", "Resolved", "resolve_profile"]


class ProfileSource(Protocol):
    """What the resolver needs of a store (``ProfileStore`` satisfies it)."""

    def get(self, name: str) -> Profile: ...

    def for_host(self, host: Platform) -> Profile | None: ...


class NoProfile(StoreError):
    """No profile of this machine is stored, and none was named."""


@dataclass(frozen=True)
class Resolved:
    """The profile to use, and the warnings every output that uses it must carry."""

    profile: Profile
    warnings: tuple[str, ...] = ()


def resolve_profile(store: ProfileSource, name: str | None, host: Platform) -> Resolved:
    """The named profile, or ``host``'s newest measured one. Warns when the platform differs
    (a published profile, or one measured on another machine, describes that machine)."""
    if name is None:
        p = store.for_host(host)
        if p is None:
            raise NoProfile(
                "no profile of this machine yet. Measure one with `meshtax profile --quick` "
                "(as root), or name one explicitly, e.g. `--profile reference` (published data "
                "of another platform)."
            )
        return Resolved(p)
    p = store.get(name)
    if p.platform.same_host(host):
        return Resolved(p)
    how = "published" if p.provenance.source == "published" else "measured"
    return Resolved(
        p,
        (
            f"profile {p.name!r} was {how} on a different platform ({p.platform.describe()}), "
            f"not this machine ({host.describe()}); predictions describe that platform",
        ),
    )
