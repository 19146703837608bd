"""Ringmaster's policy SDK for Python: helpers for router, admission and safety-filter
components built with componentize-py.

`decide` holds the pure decision helpers (ring ranks, prefix-match scoring, load arithmetic,
prefill cost) over the values a policy gathered from the host; they import nothing from the
generated bindings, so a policy's logic runs under `python -m unittest` without Wasm.
`testing` builds those values for unit tests. The bindings themselves (`wit_world`) exist only
inside a `componentize-py` build.
"""

from . import decide

__all__ = ["decide"]
__version__ = "0.1.0"
