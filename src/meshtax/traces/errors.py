"""The error of an input that cannot be read at all (kept apart: the span readers raise it
without importing the Alibaba readers, and pyarrow with them)."""

from __future__ import annotations

from meshtax.errors import TraceError


class TraceFormatError(TraceError):
    """An input that cannot be read at all (wrong columns, not CSV, truncated compression)."""
