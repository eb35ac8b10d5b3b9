"""Errors a user can fix, one type per layer, all printed by the CLI as one line (exit 2).

Each carries where the problem is (``file``, ``field``) and what was expected, when known;
``str(e)`` is the whole message. Anything else that escapes is a bug: the CLI's last-resort
handler prints one line and exits 70.
"""

from __future__ import annotations

#: exit status of a user error (bad input, missing profile, bad option)
EXIT_USER = 2
#: exit status of an unexpected exception (a bug): BSD's EX_SOFTWARE
EXIT_INTERNAL = 70


class MeshtaxError(Exception):
    """Base of every error meant for the user: a message naming the file, the field and the
    expectation. A value quoted from an input is clipped (:func:`clip`); errors about files an
    input merely references (Envoy configs, manifests) quote nothing of them."""

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        field: str | None = None,
        expected: str | None = None,
    ) -> None:
        super().__init__(message)
        self.file = file
        self.field = field
        self.expected = expected


class InputError(MeshtaxError, ValueError):
    """Safe reading (:mod:`meshtax.safeio`): not a regular file, over a size or decompression
    limit, not text, a syntax error, an alias bomb."""


class ModelError(MeshtaxError, ValueError):
    """A profile, cost model or call graph whose values cannot be used (:mod:`meshtax.model`)."""


class PredictError(MeshtaxError, ValueError):
    """A prediction or what-if that cannot be made (:mod:`meshtax.predict`)."""


class TraceError(MeshtaxError, ValueError):
    """Traces, trace stores and sidecar configurations that cannot be imported
    (:mod:`meshtax.traces`)."""


class StoreError(MeshtaxError, RuntimeError):
    """The profile database (:mod:`meshtax.store`): missing or unusable profiles, schema."""


class UsageError(MeshtaxError, RuntimeError):
    """Options and entry points (:mod:`meshtax.app`, the CLI): a bad option or combination."""


def clip(value: object, width: int = 40) -> str:
    """``repr(value)`` cut to ``width`` characters: error messages never carry a whole input."""
    r = repr(value)
    return r if len(r) <= width else r[: width - 1] + "…"
