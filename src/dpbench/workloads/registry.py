"""Which factory a workload names, and its description for records; torch-free.

A workload is a built-in's or a plugin's name (`transformer-lm`), a factory (`pkg.mod:build` or
`path/to/file.py:build`), or a mapping `{name: ..., args: {...}}` / `{factory: ..., args: {...}}`.
Plugins are entry points of the group `dpbench.workloads` (name = "module:function"); a built-in's
name wins over a plugin's. A factory is imported only by spec.build, so the planning can resolve and
describe workloads without torch."""
from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import sys
from pathlib import Path
from typing import Any, Mapping

import yaml

from dpbench.results.errors import error_text

ENTRY_POINT_GROUP = "dpbench.workloads"
DEFAULT = "resnet18-cifar10"
BUILTINS = {
    "resnet18-cifar10": "dpbench.workloads.resnet_cifar:build",
    "transformer-lm": "dpbench.workloads.transformer_lm:build",
    "torchvision": "dpbench.workloads.vision:build",
}
KEYS = ("name", "factory", "args")


class WorkloadError(Exception):
    """One line: what is wrong with a workload, and the way out."""


def plugins() -> dict[str, str]:
    """name -> "module:function" of the installed packages' entry points."""
    return {ep.name: ep.value for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def known() -> dict[str, str]:
    return {**plugins(), **BUILTINS}


def resolve(spec: str | Mapping[str, Any] | None) -> tuple[str, str, dict]:
    """(name, factory reference, args) of a workload; a user's factory is named by its reference."""
    if spec is None:
        spec = DEFAULT
    if isinstance(spec, str):
        spec = {"factory": spec} if ":" in spec else {"name": spec}
    if not isinstance(spec, Mapping):
        raise WorkloadError(f"workload {spec!r}: give a name, 'module:function', or "
                            "{name|factory: ..., args: {...}}")
    if unknown := sorted(set(spec) - set(KEYS)):
        raise WorkloadError(f"workload {dict(spec)}: unknown key(s) {', '.join(map(str, unknown))}; "
                            f"the keys are {', '.join(KEYS)}")
    if ("name" in spec) == ("factory" in spec):
        raise WorkloadError(f"workload {dict(spec)}: give exactly one of name or factory")
    args = spec.get("args") or {}
    if not isinstance(args, Mapping):
        raise WorkloadError(f"workload {dict(spec)}: args must be a mapping, not {type(args).__name__}")
    if "name" in spec:
        # a built-in wins over a plugin, so only another name needs the entry points (a scan of
        # every installed package, ~10 ms: planning resolves every run's workload)
        table = BUILTINS if spec["name"] in BUILTINS else known()
        if spec["name"] not in table:
            raise WorkloadError(f"no workload named {spec['name']!r}: known are {', '.join(sorted(table))}; "
                                "or give a factory 'pkg.module:function' or 'file.py:function'")
        return spec["name"], table[spec["name"]], dict(args)
    ref = str(spec["factory"])
    target, _, function = ref.rpartition(":")
    if not target or not function.isidentifier():
        raise WorkloadError(f"workload factory {ref!r}: write it as 'pkg.module:function' or "
                            "'path/to/file.py:function'")
    return ref, ref, dict(args)


def yaml_scalars(value: Any) -> Any:
    """Every string in `value` (nested) read as a YAML file reads a plain scalar: '64' -> 64,
    'true' -> True, '1.5e-3' -> 0.0015, 'null' -> None; other strings unchanged."""
    if isinstance(value, Mapping):
        return {k: yaml_scalars(v) for k, v in value.items()}
    if isinstance(value, list):
        return [yaml_scalars(v) for v in value]
    if isinstance(value, str) and value.strip():
        try:
            read = yaml.safe_load(value)
        except yaml.YAMLError:
            return value
        return read if read is None or isinstance(read, (bool, int, float)) else value
    return value


def typed_args(spec: Any) -> Any:
    """A workload with its args' strings read as YAML scalars (yaml_scalars). Snakemake's
    `--config 'train={workload: {..., args: {width: 64}}}'` hands every scalar over as a string;
    so typed, args reach the factory as they would from a file or from check-workload (a string
    that reads as a number or a boolean cannot be passed as a string so)."""
    if isinstance(spec, Mapping) and isinstance(spec.get("args"), Mapping):
        return {**spec, "args": yaml_scalars(spec["args"])}
    return spec


def parse(text: str):
    """A workload's command-line form: a name or factory, or a JSON/YAML mapping."""
    if not text.lstrip().startswith("{"):
        return text
    try:
        return typed_args(yaml.safe_load(text))
    except yaml.YAMLError as exc:
        raise WorkloadError(f"workload {text!r}: not a JSON/YAML mapping: {str(exc).splitlines()[0]}") from exc


def _is_file(target: str) -> bool:
    return target.endswith(".py") or "/" in target or "\\" in target


def source_file(ref: str) -> Path | None:
    """The file that defines a factory, found without importing it (a package's __init__ may run)."""
    target = ref.rpartition(":")[0]
    if _is_file(target):
        return Path(target).resolve()
    try:
        found = importlib.util.find_spec(target)
    except (ImportError, ValueError):
        return None
    return Path(found.origin) if found and found.origin and found.has_location else None


def describe(spec: str | Mapping[str, Any] | None) -> dict:
    """A record's workload: its name (a built-in's or plugin's) or factory, its args, and the
    sha256 of the factory's own source file, so a regression check sees the model change (a
    model spread over several files changes the digest when this one does; dpbench's source
    digest covers the built-ins' other files)."""
    name, ref, args = resolve(spec)
    path = source_file(ref)
    digest = hashlib.sha256(path.read_bytes()).hexdigest() if path and path.is_file() else None
    key = "factory" if name == ref else "name"
    return {key: name, "args": args, "source_sha256": digest}


def load_factory(ref: str):
    """The factory function a reference names, imported (a file is loaded as its own module)."""
    target, _, function = ref.rpartition(":")
    if _is_file(target):
        path = Path(target).resolve()
        if not path.is_file():
            raise WorkloadError(f"workload factory {ref!r}: no file {path}")
        module_name = "dpbench_workload_" + hashlib.sha256(str(path).encode()).hexdigest()[:12]
        try:
            loader_spec = importlib.util.spec_from_file_location(module_name, path)
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[module_name] = module   # dataclasses and pickling look their module up
            loader_spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(module_name, None)
            raise WorkloadError(f"workload factory {ref!r}: cannot import {path}: {error_text(exc)}") from exc
    else:
        try:
            module = importlib.import_module(target)
        except Exception as exc:
            raise WorkloadError(f"workload factory {ref!r}: cannot import {target}: {error_text(exc)} "
                                "(is its package installed, or its folder on PYTHONPATH?)") from exc
    factory = getattr(module, function, None)
    if factory is None:
        raise WorkloadError(f"workload factory {ref!r}: {target} has no function {function!r}")
    if not callable(factory):
        raise WorkloadError(f"workload factory {ref!r}: {function} is a {type(factory).__name__}, not a function")
    return factory
