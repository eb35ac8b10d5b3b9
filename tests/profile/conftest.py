from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from meshtax.testbed.pods import Testbed
from tests.profile.fakes import fake_testbed


@pytest.fixture
def tb(tmp_path: Path) -> Iterator[Testbed]:
    """An open testbed on a fake system (its state in ``tmp_path``)."""
    with fake_testbed(tmp_path / "state") as bed:
        yield bed
