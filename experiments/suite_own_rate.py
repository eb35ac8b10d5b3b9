"""A suite's kept runs predicted again with every message priced at its sidecar's own rate
instead of the shared CPU's (a diagnostic of the shared-CPU pricing, issue #14; the engine
itself is unchanged): the two rates bracket the measurements.

    .venv/bin/python experiments/suite_own_rate.py RUN/run --db DB --profile NAME

RUN/run is a `bench_suite.py --out` directory; nothing in it is measured or written (as
`bench_suite.py --report RUN/run --repredict` at the profile's own speed).
"""

from __future__ import annotations

import argparse

import numpy as np

from meshtax.model.ecg import EcgBatch
from meshtax.predict import engine
from meshtax.store.sqlite import ProfileStore
from meshtax.validate.suite_run import SuiteDir, repredict


def own_rates(batch: EcgBatch, pod_cpus: int, *, also: EcgBatch | None = None) -> np.ndarray:
    """Each invocation's own rate, whatever shares its CPU."""
    return np.asarray(batch.rate, dtype=np.float64)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="a bench_suite.py --out directory")
    ap.add_argument("--db", required=True)
    ap.add_argument("--profile", required=True)
    a = ap.parse_args()
    engine.shared_cpu_rates = own_rates  # type: ignore[attr-defined]  # read at each prediction
    res = repredict(SuiteDir(a.run), ProfileStore(a.db).get(a.profile), speed=False)
    print("\n".join([*res.header(), "", *res.comparison_table(), "", *res.by_mode_table()]))


if __name__ == "__main__":
    main()
