"""C3's text."""


from dpbench.claims import REFUTED
from dpbench.claims.c3 import text as c3_text
from dpbench.claims.records import obs

from claims.planted import _probe, fake_gpu_probes


def test_c3_summary_names_no_zero_grad_result_where_none_was_observed():
    """On one GPU the several-ids case is not run: the summary must not print an empty result."""
    one_gpu = _probe("C3", REFUTED, [
        obs("c3.cuda_one_id.construction", "one id", error="AttributeError: 'SGD' object has no attribute 'to'"),
        obs("c3.misbehaving_calls", "calls that misbehave", result=["construction (cuda:0, device_ids=[0])"])])
    text = c3_text._c3(one_gpu)
    assert "zero_grad" not in text and "one CUDA id: `AttributeError" in text
    assert "wrapper.zero_grad(): gradients accumulate" in c3_text._c3(fake_gpu_probes()["C3"])
