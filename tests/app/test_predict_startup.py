"""``predict --traces`` starts reading first: the command imports no prediction engine
(numba), and its workers fork before the engine is imported, so that it loads while they
read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.app.test_predict_stream import _jaeger

FORKED = """
import json, sys
import concurrent.futures.process as cfp
from meshtax.app.predict import PredictOptions, predict_files
from meshtax.store.sqlite import ProfileStore

seen = []
launch = cfp.ProcessPoolExecutor._launch_processes
def spy(self):
    seen.append(sorted(m for m in ("numba", "meshtax.predict.engine") if m in sys.modules))
    return launch(self)
cfp.ProcessPoolExecutor._launch_processes = spy
opts = PredictOptions((sys.argv[1],), profile="reference", rate=100.0, trace_format="jaeger")
doc = predict_files(opts, ProfileStore(sys.argv[2]), batch_spans=200)
print(json.dumps({"forks": seen, "graphs": doc["summary"]["graphs"]}))
"""


def _run(code: str, *args: str) -> str:
    r = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, check=True
    )
    return r.stdout


def test_the_predict_command_imports_no_engine() -> None:
    code = (
        "import sys; from meshtax.cli._common import main; "
        "main.get_command(None, 'predict'); print('numba' in sys.modules)"
    )
    assert _run(code).strip() == "False"


def test_workers_fork_before_the_engine_is_imported(tmp_path: Path) -> None:
    traces = _jaeger(tmp_path / "t.json", 300)  # a few hundred kB: several tasks
    got = json.loads(_run(FORKED, str(traces), str(tmp_path / "p.db")))
    assert got == {"forks": [[]], "graphs": 300}
