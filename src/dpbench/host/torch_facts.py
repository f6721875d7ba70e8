"""torch's version facts on this host (version, git version, CUDA), read without importing torch.

A host fact, not a planning one: the plan's default tag, the skip rules, the launcher and the
provenance all ask it, and planning stays torch-free.
"""
from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=1)
def torch_version() -> dict[str, str | None]:
    """torch's version facts without importing torch: its version.py, read as text. The
    installed distribution's metadata lacks the local part (2.14.1, not 2.14.1+cu130) for some
    wheels, so it is only the fallback."""
    facts: dict[str, str | None] = {"__version__": None, "git_version": None, "cuda": None}
    try:
        spec = importlib.util.find_spec("torch")
        origin = spec.origin if spec else None
        if origin:
            for node in ast.parse(Path(origin).with_name("version.py").read_text()).body:
                target = getattr(node, "target", None) or (node.targets[0] if isinstance(node, ast.Assign) else None)
                if isinstance(target, ast.Name) and target.id in facts and isinstance(node.value, ast.Constant):
                    facts[target.id] = node.value.value
    except (OSError, SyntaxError, ValueError, ImportError):
        pass
    if facts["__version__"] is None:
        try:
            facts["__version__"] = importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:
            facts["__version__"] = "none"
    return {"version": facts["__version__"], "git": facts["git_version"], "cuda": facts["cuda"]}
