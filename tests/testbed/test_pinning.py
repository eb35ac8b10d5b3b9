"""Pinning: CPU placement of client, sidecars and app, recorded with results."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from meshtax.model.components import OTHER
from meshtax.model.sidecar import Mode
from meshtax.testbed.pinning import (
    CLIENT_APART,
    ONE_CPU,
    UNPINNED,
    Pinning,
    available_cpus,
    nice_of,
)
from tests.helpers import flat, profile


@pytest.mark.parametrize(("opts", "nice"), [({"nice": -20}, -20), ({"nice": 5.0}, 5), ({}, None)])
def test_the_nice_value_is_the_profiles(opts: dict[str, Any], nice: int | None) -> None:
    p = profile({Mode.HTTP: {OTHER: flat(25, 50)}})
    assert nice_of(replace(p, provenance=replace(p.provenance, options=opts))) == nice


@pytest.mark.parametrize(
    ("pin", "role", "netns", "uid", "argv"),
    [
        (CLIENT_APART, "client", None, None, ["taskset", "-c", "0", "x"]),
        (
            CLIENT_APART,
            "sidecars",
            "pod",
            1337,
            [
                "ip",
                "netns",
                "exec",
                "pod",
                "taskset",
                "-c",
                "1",
                "setpriv",
                "--reuid=1337",
                "--regid=1337",
                "--clear-groups",
                "x",
            ],
        ),
        (
            Pinning(app=(0, 1)),
            "app",
            "pod",
            None,
            ["ip", "netns", "exec", "pod", "taskset", "-c", "0,1", "x"],
        ),
        (UNPINNED, "app", None, None, ["x"]),
    ],
)
def test_place(
    pin: Pinning, role: str, netns: str | None, uid: int | None, argv: list[str]
) -> None:
    assert pin.place(role, netns=netns, uid=uid).wrap(["x"]) == argv


@pytest.mark.parametrize(
    ("pin", "text"),
    [
        (ONE_CPU, "client=0 sidecars=0 app=0"),
        (UNPINNED, "client=* sidecars=* app=*"),
        (Pinning(client=(0,), app=(0, 1)), "client=0 sidecars=* app=0,1"),
    ],
)
def test_describe_and_round_trip(pin: Pinning, text: str) -> None:
    assert pin.describe() == text
    assert Pinning.from_dict(pin.to_dict()) == pin


def test_available_cpus_is_nonempty_and_sorted() -> None:
    cpus = available_cpus()
    assert cpus and list(cpus) == sorted(cpus)


def test_pod_cpus_counts_the_cpus_apps_and_sidecars_share() -> None:
    assert Pinning(client=(0,), sidecars=(1,), app=(1,)).pod_cpus((0, 1)) == 1
    assert Pinning(client=(0,), sidecars=(1,), app=(2, 3)).pod_cpus((0, 1, 2, 3)) == 3
    assert Pinning().pod_cpus((0, 1)) == 2  # unpinned: anywhere
