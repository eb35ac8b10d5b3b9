"""meshtax: what does a service mesh cost me?

Profile a real sidecar on this machine, then predict the latency, CPU and memory overhead
that sidecars add to an extended call graph (ECG).
"""

from meshtax._version import __version__

__all__ = ["__version__"]
