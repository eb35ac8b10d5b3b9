"""ModeProfile.tls_handshake: optional, round-trips, and old documents without it still load."""

from __future__ import annotations

import dataclasses

from meshtax.model.profile import ModeProfile, Profile
from meshtax.model.sidecar import Mode
from tests.helpers import flat, profile


def test_handshake_round_trip_and_backward_compatible() -> None:
    p = profile({Mode.TCP: {}, Mode.HTTP: {}})
    hs = flat(250.0, 180.0)
    mp = dataclasses.replace(p.modes[Mode.HTTP], tls_handshake=hs)
    q = p.with_modes([p.modes[Mode.TCP], mp])
    back = Profile.from_dict(q.to_dict())
    assert back == q
    assert back.modes[Mode.HTTP].tls_handshake == hs
    assert back.modes[Mode.TCP].tls_handshake is None
    old = q.to_dict()["modes"]["http"]
    del old["tls_handshake"]  # a document written before the field existed
    assert ModeProfile.from_dict(old).tls_handshake is None
