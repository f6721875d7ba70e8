"""C3: nn.DataParallel(optimizer, device_ids=...), as the article suggests.

DataParallel is meant for Modules. An optimizer is stored as a plain attribute, so the
wrapper's own Module methods (zero_grad, state_dict, parameters) see nothing.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from dpbench.claims import NUANCE, REFUTED
from dpbench.claims.common import error_text, gpus_visible, needs, record
from dpbench.claims.records import Observation, ProbeRecord
from dpbench.claims.records import obs as observation


def _model_and_opt(device: str):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2)).to(device)
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _backward(model: nn.Module, device: str) -> None:
    torch.manual_seed(1)
    model(torch.randn(16, 8, device=device)).pow(2).mean().backward()


def _attempt(fn):
    try:
        return {"result": repr(fn())}
    except Exception as e:
        return {"error": error_text(e)}


def wrapped_behaviour(case: str, device: str, ids: list[int]) -> list[Observation]:
    """What each call on the wrapper does; `misbehaves` marks a silent or loud failure. `case`
    names the observations: c3.<case>.construction, c3.<case>.zero_grad, ..."""
    model, opt = _model_and_opt(device)
    where = f"{device}, device_ids={ids}"
    oid = lambda call: f"c3.{case}.{call}"
    try:
        wrapper = nn.DataParallel(opt, device_ids=ids)
    except Exception as e:
        return [observation(oid("construction"), f"construction ({where})", error=error_text(e), misbehaves=True)]
    obs = [observation(oid("construction"), f"construction ({where})", result="constructs",
                       **{"wrapper.device_ids": wrapper.device_ids, "module is the optimizer": wrapper.module is opt},
                       misbehaves=False)]

    _backward(model, device)
    once = [p.grad.clone() for p in model.parameters()]
    wrapper.zero_grad()  # the article's loop would call this on the wrapper
    _backward(model, device)
    doubled = all(torch.allclose(p.grad, 2 * g) for p, g in zip(model.parameters(), once))
    obs.append(observation(oid("zero_grad"), f"wrapper.zero_grad() between two backward passes ({where})",
                           result="gradients accumulate (grad == 2 x one pass)" if doubled else "gradients zeroed",
                           misbehaves=doubled))

    before = [p.detach().clone() for p in model.parameters()]
    wrapper.module.step()
    moved = any(not torch.equal(p, b) for p, b in zip(model.parameters(), before))
    obs.append(observation(oid("module_step"), f"wrapper.module.step() ({where})",
                           result="updates the parameters (it is the original optimizer)" if moved else "no update",
                           misbehaves=not moved))

    sd = wrapper.state_dict()
    obs.append(observation(oid("state_dict"), f"wrapper.state_dict() ({where})", result=repr(dict(sd)),
                           **{"optimizer state entries": len(opt.state_dict()["state"])},
                           misbehaves=len(sd) == 0 and len(opt.state_dict()["state"]) > 0))
    sched = _attempt(lambda: torch.optim.lr_scheduler.StepLR(wrapper, step_size=1))
    obs.append(observation(oid("scheduler"), f"torch.optim.lr_scheduler.StepLR(wrapper, step_size=1) ({where})",
                           **sched, misbehaves="error" in sched))
    params = _attempt(lambda: wrapper.param_groups)
    obs.append(observation(oid("param_groups"), f"wrapper.param_groups ({where})", **params,
                           misbehaves="error" in params))
    return obs


def run() -> ProbeRecord:
    n = gpus_visible()
    obs = wrapped_behaviour("cpu", "cpu", [0, 1])  # no CUDA: DataParallel stores the module unchecked
    parts_not_run = []
    if n >= 1:
        obs += wrapped_behaviour("cuda_one_id", "cuda:0", [0])
    else:
        parts_not_run.append(f"one CUDA id: {needs(1, n)}")
    if n >= 2:
        obs += wrapped_behaviour("cuda_all_ids", "cuda:0", list(range(n)))
    else:
        parts_not_run.append(f"several CUDA ids: {needs(2, n)}")
    bad = [o.what for o in obs if o.get("misbehaves")]
    # Nothing in an optimizer step is split across devices, so the wrapper can at best do
    # nothing; any misbehaving call makes the advice harmful, not just useless.
    verdict = REFUTED if bad else NUANCE
    obs.append(observation("c3.misbehaving_calls", "calls that misbehave", result=bad))
    return record("C3", obs, verdict, parts_not_run=parts_not_run)
