"""The variant registry: every variant's VariantSpec, one module per variant, and the questions
the other layers ask it (the variant list, which variant takes which option, the docs' table).

Why here and not in run/variants/ (DESIGN's picture): the layer arrows win. Planning decides
which runs exist, what they may set and why one is skipped, and it must not import dpbench.run
nor torch; analysis, reports and claims sit above plan and read it too. So the declarative half
of a variant (processes, devices, wrapper, loss reduction, mesh, what it shards, its own config
keys and the options it refuses) lives here, torch-free (the import contract checks it), and its
torch half (wrap the model, build the optimizer) in `dpbench.run.variants.<spec.runtime>`, one
module per wrapper that the specs name. A new variant is a module here declaring SPEC (found by
listing this package: no list to edit), plus a runtime module where no wrapper fits it.

Adding a variant's own option: its schema entry (experiments/schema.yaml: type, default, what it
does) and a field of a settings dataclass its spec lists in `config` (settings.py: `knob(...)`
says whether it changes the setup, whether old records lack it); the runtime reads that typed
object (spec.setting), not the flat RunConfig.
"""
from __future__ import annotations

import functools
import importlib
import pkgutil
from typing import Any, Iterable, Mapping

from dpbench.plan.variants.spec import Knob, VariantSpec

__all__ = ["VariantSpec", "Knob", "all_specs", "spec", "names", "specific_options", "takers",
           "takes", "ignored", "refusal", "quiet_keys", "setup_neutral_keys", "markdown_table"]


@functools.lru_cache(maxsize=1)
def all_specs() -> tuple[VariantSpec, ...]:
    """Every module of this package that declares SPEC, in the specs' order."""
    found = []
    for module in pkgutil.iter_modules(__path__):
        spec_ = getattr(importlib.import_module(f"{__name__}.{module.name}"), "SPEC", None)
        if isinstance(spec_, VariantSpec):
            if spec_.name != module.name:
                raise ValueError(f"{__name__}.{module.name} declares variant {spec_.name!r}: name the module after it")
            found.append(spec_)
    return tuple(sorted(found, key=lambda s: (s.order, s.name)))


def names() -> tuple[str, ...]:
    return tuple(s.name for s in all_specs())


def spec(name: str) -> VariantSpec:
    """The spec of variant `name`; KeyError names the known ones."""
    for s in all_specs():
        if s.name == name:
            return s
    raise KeyError(f"unknown variant {name!r}; known: {', '.join(names())}")


def specific_options() -> tuple[str, ...]:
    """The options some variants take and the others ignore (a wrapper's knobs)."""
    return tuple(dict.fromkeys(k for s in all_specs() for k in s.knob_keys))


def _knobs() -> dict[str, Knob]:
    """Every variant's keys; a key two settings classes declare must say the same of it."""
    found: dict[str, Knob] = {}
    for knob in (k for s in all_specs() for k in s.knobs):
        if found.setdefault(knob.key, knob) != knob:
            raise ValueError(f"{knob.key!r} is declared twice, differently: {found[knob.key]} and {knob}")
    return found


def quiet_keys() -> tuple[str, ...]:
    """The variants' keys a run's config leaves out at their defaults (newer than the first records)."""
    return tuple(k for k, knob in _knobs().items() if knob.quiet_at_default)


def setup_neutral_keys() -> tuple[str, ...]:
    """The variants' keys that do not make a different setup (a wrapper's tuning)."""
    return tuple(k for k, knob in _knobs().items() if not knob.changes_setup)


def takers(option: str) -> tuple[str, ...]:
    """The variants that take `option` (every variant for an option no wrapper owns)."""
    if option not in specific_options():
        return names()
    return tuple(s.name for s in all_specs() if s.takes(option))


def takes(variant: str, option: str) -> bool:
    return variant in takers(option)


def ignored(variant: str, options: Mapping[str, Any], defaults: Mapping[str, Any]) -> list[str]:
    """The options `variant` ignores that `options` set to other than their default."""
    return [k for k in specific_options()
            if k in options and options[k] != defaults.get(k) and not takes(variant, k)]


def refusal(where: str, option: str, value: Any, variants: Iterable[str]) -> str:
    """One line: the option, the variants that would ignore it, the variants that take it, the way out."""
    ignoring, taking = list(variants), takers(option)
    return (f"{where} sets {option}={value!r} for {', '.join(ignoring)}, which "
            f"{'ignores' if len(ignoring) == 1 else 'ignore'} it (it is {' and '.join(taking)}'s: "
            f"dpbench/plan/variants/); give it to a group of variants [{', '.join(taking)}], "
            f"or leave it out")


def markdown_table() -> str:
    """The docs' variant table (README.md), one row a spec."""
    rows = [f"| `{s.name}` | {s.summary} |" for s in all_specs()]
    return "\n".join(["| variant | what it is |", "|---|---|", *rows])
