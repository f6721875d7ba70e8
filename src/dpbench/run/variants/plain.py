"""single's runtime: the model as it is, on its one device."""
from __future__ import annotations

from dpbench.run.variants.base import WrapRequest, Wrapped


def wrap(req: WrapRequest) -> Wrapped:
    return Wrapped(req.model, req.output)
