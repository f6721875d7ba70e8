"""torchvision imported, or one clear line when its wheel was built for another torch than the
one installed (its C++ operators then fail to register deep inside the import).
"""
from __future__ import annotations

import importlib
import importlib.util
import re
from importlib import metadata
from pathlib import Path

import torch


class TorchvisionMismatch(RuntimeError):
    """torchvision was built for another torch than the one installed: `torchvision` and `torch`
    are the two versions, `pair` the torchvision release that matches this torch (None: unknown)."""

    def __init__(self, message: str, *, torchvision: str = "?", torch: str = "", pair: str | None = None):
        super().__init__(message)
        self.torchvision, self.torch, self.pair = torchvision, torch, pair


def import_torchvision(module: str = "torchvision"):
    """Import a torchvision module; a build for another torch fails with one clear line.

    A torchvision wheel works only with the torch it was built against (same release and
    same build: CPU or CUDA). Otherwise its C++ operators do not register and the import
    fails deep inside with "operator torchvision::nms does not exist".
    """
    try:
        return importlib.import_module(module)
    except RuntimeError as exc:
        if "torchvision::" not in str(exc):
            raise
        raise TorchvisionMismatch(mismatch_message(str(exc)), torchvision=_torchvision_build()[0],
                                  torch=torch.__version__, pair=_matching_torchvision(torch.__version__)) from exc


def mismatch_message(cause: str) -> str:
    tv, wants = _torchvision_build()
    built = f" (it asks for {wants})" if wants else ""
    pair = _matching_torchvision(torch.__version__)
    fix = (f"pip install --force-reinstall torch=={torch.__version__.split('+')[0]} "
           f"torchvision=={pair}" if pair else "pip install torchvision of the same release")
    first = cause.strip().splitlines()[0] if cause.strip() else "its operators are missing"
    return (f"torchvision {tv} does not match torch {torch.__version__}{built}: {first}; "
            f"install the matching pair from the same index, e.g. `{fix}` "
            f"(from the index torch came from; for CPU builds "
            f"--index-url https://download.pytorch.org/whl/cpu)")


def _torchvision_build() -> tuple[str, str]:
    """torchvision's full version (with its +cpu/+cuXXX build) and the torch it asks for,
    read without importing it (the import is what fails)."""
    try:
        version, wants = metadata.version("torchvision"), ""
        for req in metadata.requires("torchvision") or []:
            name, _, rest = req.partition(" ")
            if re.split(r"[;(<>=!~\[]", name, maxsplit=1)[0] == "torch":
                wants = "torch" + re.sub(r"[\s()]", "", (name[5:] + rest).split(";")[0])
    except metadata.PackageNotFoundError:
        return "?", ""
    spec = importlib.util.find_spec("torchvision")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        try:
            m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", (Path(folder) / "version.py").read_text())
        except OSError:
            continue
        if m:
            version = m.group(1)
    return version, wants


def _matching_torchvision(torch_version: str) -> str | None:
    """torchvision 0.(minor+15).patch pairs with torch 2.minor.patch (since torch 2.0)."""
    try:
        major, minor, patch = (int(v) for v in torch_version.split("+")[0].split(".")[:3])
    except ValueError:
        return None
    return f"0.{minor + 15}.{patch}" if major == 2 else None
