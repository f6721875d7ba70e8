"""How dpbench calls a workload's model: its inputs in, one tensor out. Every forward of a run
(each variant's losses, DataParallel's replicas, evaluation) and of `dpbench check-workload` goes
through `model_output`, so that a model trains wherever it checks.

Inputs (what the batch maker returns first) are one of:
  a tensor                   model(x)
  a tuple or list of tensors model(*x)       e.g. (input_ids, attention_mask)
  a dict of tensors          model(**x)      e.g. {"input_ids": ..., "attention_mask": ...}
every tensor with the batch first: a rank or a DataParallel replica gets the same rows of each,
and the batch's size is the first tensor's first dimension.

Outputs: the tensor the loss takes is
  the WorkloadSpec's `output` where given: a function of forward's result, a key or attribute
    name ("logits"), or an index into a tuple;
  else forward's result when it is a tensor;
  else from a dict or a Hugging Face ModelOutput: the value of "logits" (key or attribute), or its
    only tensor value;
  else from a tuple or list: its first element, when it is a tensor;
and anything else is an OutputError that says what forward returned and how to choose.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Union

import torch
import torch.nn as nn

Inputs = Union[torch.Tensor, tuple, list, Mapping[str, torch.Tensor]]
Output = Union[str, int, Callable[[Any], torch.Tensor], None]


class OutputError(TypeError):
    """Forward's result holds no tensor dpbench can take by its rule; the message says what to give."""


class InputError(TypeError):
    """Inputs that are not a tensor, a tuple/list or a dict of tensors."""


def tensors(inputs: Inputs) -> list[torch.Tensor]:
    """The input tensors in order (a dict's in its order)."""
    if isinstance(inputs, torch.Tensor):
        return [inputs]
    if isinstance(inputs, Mapping):
        values = list(inputs.values())
    elif isinstance(inputs, (tuple, list)):
        values = list(inputs)
    else:
        values = None
    if not values or not all(isinstance(v, torch.Tensor) for v in values):
        kinds = f"a {type(inputs).__name__}" if values is None else \
            f"a {type(inputs).__name__} of {', '.join(sorted({type(v).__name__ for v in values})) or 'nothing'}"
        raise InputError(f"inputs are {kinds}: give a tensor, a tuple of tensors (forward(*x)) or a dict of "
                         "tensors (forward(**x)), each with the batch first")
    return values


def first_tensor(inputs: Inputs) -> torch.Tensor:
    return tensors(inputs)[0]


def batch_size(inputs: Inputs) -> int:
    """Samples in the inputs: the first tensor's first dimension."""
    return first_tensor(inputs).shape[0]


def nbytes(inputs: Inputs) -> int:
    return sum(t.nbytes for t in tensors(inputs))


def map_tensors(inputs: Inputs, fn: Callable[[torch.Tensor], torch.Tensor]) -> Inputs:
    """The inputs, of the same structure, with fn applied to each tensor (a slice, a copy to the device)."""
    tensors(inputs)   # refuses any other structure
    if isinstance(inputs, torch.Tensor):
        return fn(inputs)
    if isinstance(inputs, Mapping):
        return {k: fn(v) for k, v in inputs.items()}
    return type(inputs)(fn(v) for v in inputs)


def equal(a: Inputs, b: Inputs) -> bool:
    """The same structure and the same tensors."""
    if type(a) is not type(b) or (isinstance(a, Mapping) and list(a) != list(b)):
        return False
    ta, tb = tensors(a), tensors(b)
    return len(ta) == len(tb) and all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(ta, tb))


def call(model: nn.Module, inputs: Inputs) -> Any:
    """forward(x), forward(*x) for a tuple or list, forward(**x) for a dict."""
    if isinstance(inputs, Mapping):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def _describe(out: Any) -> str:
    if isinstance(out, Mapping):
        return f"a {type(out).__name__} with keys {', '.join(map(str, out)) or '(none)'}"
    if isinstance(out, (tuple, list)):
        return f"a {type(out).__name__} of {', '.join(type(v).__name__ for v in out) or 'nothing'}"
    return f"a {type(out).__name__}"


def output_tensor(out: Any, output: Output = None) -> torch.Tensor:
    """The tensor the loss takes from forward's result `out` (the module docstring's rule)."""
    how = "WorkloadSpec(output=...): a key or attribute name ('logits'), a tuple index, or a function"
    if output is not None:
        if callable(output):
            found = output(out)
        elif isinstance(output, int) and isinstance(out, (tuple, list)) and -len(out) <= output < len(out):
            found = out[output]
        elif isinstance(output, str) and isinstance(out, Mapping) and output in out:
            found = out[output]
        else:
            found = getattr(out, output, None) if isinstance(output, str) else None
        if not isinstance(found, torch.Tensor):
            raise OutputError(f"output {getattr(output, '__name__', output)!r} took a {type(found).__name__}, "
                              f"not a tensor, from forward's result ({_describe(out)}); set {how}")
        return found
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, Mapping):
        if isinstance(out.get("logits"), torch.Tensor):
            return out["logits"]
        values = [v for v in out.values() if isinstance(v, torch.Tensor)]
        if len(values) == 1:
            return values[0]
    elif isinstance(getattr(out, "logits", None), torch.Tensor):
        return out.logits
    elif isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise OutputError(f"forward returned {_describe(out)}: dpbench takes a tensor, a dict's or ModelOutput's "
                      f"'logits' or only tensor, or a tuple's first element; say which with {how}")


def model_output(model: nn.Module, inputs: Inputs, output: Output = None) -> torch.Tensor:
    """The model called on the inputs (`call`) and its output's tensor (`output_tensor`), in the
    dtype forward computed it (a loss takes it in fp32: `.float()` where the loss is taken, so
    DataParallel still gathers bf16 outputs)."""
    return output_tensor(call(model, inputs), output)
