"""Why FSDP2 with a bf16 MixedPrecisionPolicy hung: one rank per case, every wait bounded.

    torchrun --standalone --nproc-per-node N tools/device/fsdp_bf16_probe.py CASE

CASE: fp32 | bf16 | bf16-noreshard | fp32-channels-last | bf16-autocast. Builds the default
workload (ResNet18-CIFAR) through dpbench, applies fully_shard per BasicBlock then on the root,
and trains 6 steps of SGD on random images. The process group has a 60 s timeout and
faulthandler dumps every thread's stack after 45 s, so a hang shows where it waits instead of
waiting forever. Prints one JSON line per rank: the case, ok or the error, and the step times.
"""
from __future__ import annotations

import faulthandler
import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main(case: str) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from dpbench.workloads.spec import build

    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=dev, timeout=timedelta(seconds=60))
    faulthandler.dump_traceback_later(45, exit=False)
    out = {"case": case, "rank": rank, "torch": torch.__version__}
    try:
        torch.manual_seed(0)
        spec = build("resnet18-cifar10", num_classes=10)
        model = spec.model.to(dev)
        if case == "fp32-channels-last":
            model = model.to(memory_format=torch.channels_last)
        kw = {}
        if case.startswith("bf16") and case != "bf16-autocast":
            kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        reshard = case != "bf16-noreshard"
        for m in model.modules():
            if isinstance(m, spec.shard_modules):
                fully_shard(m, reshard_after_forward=reshard, **kw)
        fully_shard(model, reshard_after_forward=reshard, **kw)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        g = torch.Generator().manual_seed(rank)
        times = []
        for step in range(6):
            x = torch.randn(256, 3, 32, 32, generator=g).to(dev)
            y = torch.randint(0, 10, (256,), generator=g).to(dev)
            t0 = time.perf_counter()
            ctx = torch.autocast("cuda", dtype=torch.bfloat16) if case == "bf16-autocast" else torch.autocast("cuda", enabled=False)
            with ctx:
                loss = spec.loss(model(x).float(), y).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            torch.cuda.synchronize()
            times.append(round((time.perf_counter() - t0) * 1e3, 2))
            print(f"[rank {rank}] {case} step {step} loss {loss.item():.4f}", flush=True)
        out.update(status="ok", step_ms=times)
    except Exception as exc:   # the error a peer would wait on forever
        out.update(status="error", error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
    faulthandler.cancel_dump_traceback_later()
    print(json.dumps(out), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
