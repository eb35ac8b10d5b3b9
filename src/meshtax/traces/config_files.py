"""Reading configuration files (Envoy configs, Kubernetes/Istio manifests) and the one error
type of the configuration importers."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from meshtax import safeio
from meshtax.errors import InputError, TraceError

__all__ = ["ConfigImportError", "load_documents"]


class ConfigImportError(TraceError):
    """A configuration file that cannot be imported: names the file, the document and what was expected."""

    def __init__(self, source: str, message: str, doc_index: int | None = None) -> None:
        self.source = source
        self.doc_index = doc_index
        self.detail = message
        where = source if doc_index is None else f"{source} (document {doc_index + 1})"
        super().__init__(f"{where}: {message}", file=source)


def load_documents(path: str | Path) -> list[Any]:
    """Parse a YAML (possibly multi-document) or JSON file with :mod:`meshtax.safeio`
    (regular files only, size limit, alias budget); messages never quote the file."""
    p = Path(path)
    src = str(p)
    try:
        text = safeio.read_text(p, "a configuration file (YAML or JSON)")
        if not text.strip():
            raise ConfigImportError(src, "the file is empty")
        if p.suffix.lower() == ".json":
            return [safeio.parse_json(text, src)]
        return safeio.parse_yaml_all(text, src)
    except InputError as e:
        m = re.match(rf"{re.escape(src)}(?: \(document (\d+)\))?: (.*)", str(e), re.S)
        if m is None:
            raise ConfigImportError(src, str(e)) from None
        doc = int(m.group(1)) - 1 if m.group(1) else None
        raise ConfigImportError(src, m.group(2), doc) from None
