"""C3's probe on the CPU path."""


from dpbench.claims import REFUTED
from dpbench.claims.c3 import probe as c3_probe

from claims.planted import cpu_only


@cpu_only
def test_c3_cpu_path_wrapper_is_inert_and_grads_accumulate():
    rec = c3_probe.run()
    assert rec.values("c3.cpu.construction")["wrapper.device_ids"] == []  # ids dropped without CUDA
    assert rec.values("c3.cpu.zero_grad")["result"].startswith("gradients accumulate")
    assert rec.values("c3.cpu.state_dict")["result"] == "{}"
    assert rec.values("c3.cpu.scheduler")["error"] == "TypeError: DataParallel is not an Optimizer"
    assert not rec.values("c3.cpu.module_step")["misbehaves"]
    assert rec.verdict == REFUTED
    assert all("needs" in p for p in rec.parts_not_run) and len(rec.parts_not_run) == 2
