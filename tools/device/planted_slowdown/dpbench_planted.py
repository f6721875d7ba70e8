"""A planted slowdown for one environment of a paired upgrade check (issue 27's benchmark).

tools/device/paired_upgrade.sh puts this module first on one environment's PYTHONPATH, beside a
sitecustomize.py that imports it (PYTHONPATH comes before the standard library's own).
With DPBENCH_PLANT_US set, every optimizer step of that environment is preceded by a GPU kernel
that spins for that many microseconds (torch.cuda._sleep, calibrated once with CUDA events), in
every run, or with DPBENCH_PLANT_ONLY=ddp in distributed runs only (one cell): the environment
is slower by a known amount while its torch, code and data stay the same.
"""
import os

_US = float(os.environ.get("DPBENCH_PLANT_US", "0") or 0)
_ONLY = os.environ.get("DPBENCH_PLANT_ONLY", "all")

if _US > 0:
    import torch
    import torch.distributed as dist
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    _cycles: list[int] = []

    def _calibrate() -> int:
        """GPU cycles per microsecond of torch.cuda._sleep on this device."""
        torch.cuda._sleep(1_000_000)   # warm the kernel
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(20_000_000)
        end.record()
        end.synchronize()
        return int(20_000_000 / (start.elapsed_time(end) * 1e3))

    def _plant(optimizer, args, kwargs):
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return
        if _ONLY == "ddp" and not (dist.is_available() and dist.is_initialized()):
            return
        if not _cycles:
            _cycles.append(_calibrate())
        torch.cuda._sleep(int(_cycles[0] * _US))

    register_optimizer_step_pre_hook(_plant)
