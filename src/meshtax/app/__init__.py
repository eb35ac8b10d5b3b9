"""Every entry point of meshtax, behind the CLI: options in, results out; no argv, no printing.

- :mod:`meshtax.app.predict`: predict call graphs or traces, study a store;
- :mod:`meshtax.app.measure`: profile, calibrate, validate, sweep, readiness checks (root);
- :mod:`meshtax.app.data`: profiles in and out, examples, trace import, reports.
"""

from __future__ import annotations

from meshtax.app.errors import UsageError

__all__ = ["UsageError"]
