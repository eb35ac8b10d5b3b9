"""Test helper: open a Testbed, make pods and processes, report them, then wait to be killed.

Prints one JSON line {"run_id", "netns", "pids"} once everything exists. Used to check
cleanup after SIGINT/SIGTERM and reaping after SIGKILL.
"""

from __future__ import annotations

import json
import time

from meshtax.testbed.pods import Testbed
from meshtax.testbed.system import RealSystem


def main() -> None:
    with Testbed(RealSystem(), lock_timeout=30) as tb:
        a = tb.add_pod("a")
        tb.add_pod("b")
        in_pod = tb.spawn(a, ["sleep", "300"])  # reaped via its namespace and its record
        outside = tb.spawn(None, ["sleep", "300"])  # reaped via its record only
        report = {
            "run_id": tb.run_id,
            "netns": [tb.bridge_netns, *(p.netns for p in tb.pods.values())],
            "pids": [in_pod.pid, outside.pid],
        }
        print(json.dumps(report), flush=True)
        while True:
            time.sleep(0.1)


if __name__ == "__main__":
    main()
