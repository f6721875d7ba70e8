"""C2: device_ids that do not include the model's device, and the CUDA_VISIBLE_DEVICES fix.

Every case runs in a fresh interpreter: which GPUs a process sees is fixed when CUDA
initialises, so cases must not share a process.
"""
from __future__ import annotations

from dpbench.claims import CONFIRMED, NOT_RUN, NUANCE, REFUTED
from dpbench.claims.common import gpus_visible, needs, record, run_python
from dpbench.claims.records import ProbeRecord
from dpbench.claims.records import obs as observation

# Builds the model on `model_dev`, wraps it with `ids`, runs one forward; reports where it broke.
_WRAP = """
import json, torch, torch.nn as nn
from dpbench.claims.common import error_text
from dpbench.workloads.resnet import resnet18
r = {{"visible": torch.cuda.device_count(),
      "uuids": [str(torch.cuda.get_device_properties(i).uuid) for i in range(torch.cuda.device_count())]}}
m = resnet18().to({model_dev!r})
try:
    net = nn.DataParallel(m, device_ids={ids!r})
except Exception as e:
    r.update(stage="construction", error=error_text(e))
else:
    r["model_device_after_construction"] = str(next(m.parameters()).device)
    try:
        y = net(torch.randn(8, 3, 32, 32, device={model_dev!r}))
        r.update(stage=None, output_device=str(y.device))
    except Exception as e:
        r.update(stage="first forward", error=error_text(e))
print(json.dumps(r))
"""

# Sets CUDA_VISIBLE_DEVICES after CUDA initialised, then looks whether anything changed.
_LATE = """
import json, os, torch
torch.cuda.init()
before = torch.cuda.device_count()
os.environ["CUDA_VISIBLE_DEVICES"] = {keep!r}
after = torch.cuda.device_count()
torch.zeros(1, device="cuda:%d" % (before - 1))  # the hidden GPU is still usable
print(json.dumps({{"before": before, "after": after, "last_gpu_still_usable": True}}))
"""

# Sets it after `import torch` but before the first CUDA call: torch initialises lazily.
_AFTER_IMPORT = """
import json, os, torch
os.environ["CUDA_VISIBLE_DEVICES"] = {keep!r}
print(json.dumps({{"visible": torch.cuda.device_count()}}))
"""


def run() -> ProbeRecord:
    n = gpus_visible()
    if n < 2:
        return record("C2", [], NOT_RUN, not_run=needs(2, n))
    ids = [2, 3] if n >= 4 else [1, 0]  # the article's ids where they exist
    env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    physical = run_python(_WRAP.format(model_dev="cuda:0", ids=[0]), env)
    obs = []
    for oid, case_ids in (("c2.wrap.first_id_only", [ids[0]]), ("c2.wrap.model_not_on_first_id", ids)):
        r = run_python(_WRAP.format(model_dev="cuda:0", ids=case_ids), env)
        obs.append(observation(oid, f"model on cuda:0, DataParallel(device_ids={case_ids})", **r))
    wrong = obs[-1].values
    renumbered = [str(i) for i in ids]
    fixed = run_python(_WRAP.format(model_dev="cuda:0", ids=list(range(len(ids)))),
                       {**env, "CUDA_VISIBLE_DEVICES": ",".join(renumbered)})
    if fixed.get("uuids") and physical.get("uuids"):  # which physical GPU is now cuda:0
        fixed["cuda0_physical_index"] = physical["uuids"].index(fixed["uuids"][0])
    obs.append(observation("c2.cvd.set_before_start",
                           f"CUDA_VISIBLE_DEVICES={','.join(renumbered)} set before start, model on cuda:0, "
                           f"device_ids={list(range(len(ids)))}", **fixed))
    late = run_python(_LATE.format(keep=str(ids[0])))
    obs.append(observation("c2.cvd.set_after_cuda_init",
                           f"CUDA_VISIBLE_DEVICES={ids[0]} set after torch.cuda.init()", **late))
    lazy = run_python(_AFTER_IMPORT.format(keep=str(ids[0])))
    obs.append(observation("c2.cvd.set_after_import",
                           f"CUDA_VISIBLE_DEVICES={ids[0]} set after import torch, before any CUDA call", **lazy))
    plain = run_python(_WRAP.format(model_dev=f"cuda:{ids[0]}", ids=ids), env)
    obs.append(observation("c2.plain_fix", f"plain fix: model.to('cuda:{ids[0]}'), device_ids={ids}", **plain))

    errored = wrong.get("stage") is not None
    cvd_works = fixed.get("stage", "x") is None
    late_inert = late.get("after") == late.get("before")
    plain_works = plain.get("stage", "x") is None
    if not errored:
        verdict = REFUTED
    elif cvd_works and (late_inert or plain_works):
        verdict = NUANCE  # the fix works, but only before CUDA init, and a simpler one exists
    else:
        verdict = CONFIRMED
    return record("C2", obs, verdict)
