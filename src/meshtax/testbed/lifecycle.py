"""``with`` for the testbed's processes: started on entry, stopped on exit (errors and Ctrl-C
included)."""

from __future__ import annotations

from types import TracebackType
from typing import Self

__all__ = ["Started"]


class Started:
    """A process wrapper with ``start()`` and ``stop()``: ``with X(...) as x`` starts it and
    stops it however the block ends."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> object:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
