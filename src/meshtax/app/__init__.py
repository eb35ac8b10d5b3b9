"""Every entry point of meshtax, behind the CLI: options in, results out; no argv, no printing.

- :mod:`meshtax.app.predict`: predict call graphs or traces, study a store;
- :mod:`meshtax.app.measure`: profile, validate, sweep, readiness checks (root);
- :mod:`meshtax.app.data`: profiles in and out, examples, trace import, reports.
"""

from __future__ import annotations

from meshtax.errors import MeshtaxError, UsageError
from meshtax.testbed.runstate import RunBusy
from meshtax.testbed.tools import ToolMissing

__all__ = ["USER_ERRORS", "UsageError"]

#: what the CLI reports as a user error (one line, exit 2): bad input or options, a missing
#: tool (the message says how to install it), another run holding the testbed
USER_ERRORS: tuple[type[Exception], ...] = (MeshtaxError, ToolMissing, RunBusy)
