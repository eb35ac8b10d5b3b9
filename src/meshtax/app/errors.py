"""The application layer's error: a problem the user can fix (bad input, missing profile,
not root), printed without a traceback."""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(RuntimeError):
    """A problem the user can fix; the CLI prints it as one line and exits 2."""
