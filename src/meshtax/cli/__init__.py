"""The `meshtax` command: argv → frozen options → one library call → printed results.

Nothing below this package parses argv or prints. User errors print one clear message and
exit 2; they never show a traceback. Commands are grouped by what they do:
:mod:`~meshtax.cli.predict` (predict and data), :mod:`~meshtax.cli.profiles` (the
profile store), :mod:`~meshtax.cli.whatif` (what-if studies of
measured optimizations), :mod:`~meshtax.cli.measure` and :mod:`~meshtax.cli.doctor` (root).
"""

from __future__ import annotations

from meshtax.cli._common import main  # commands are imported when asked for (COMMANDS)

__all__ = ["main"]
